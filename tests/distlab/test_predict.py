"""Predict before you run (issue 28): the widget of ``distlab.lab.predict`` and its cells in every notebook.

No kernel: the widget is driven here as a browser would (typing sets the box's value, a click calls the
button's handlers); the notebooks' cells run in ``tests/tiers/test_notebooks.py``.
"""
from __future__ import annotations

import re

import ipywidgets as widgets
import jupytext
import pytest

from distlab.lab.predict import NOT_YET, predict
from tests.helpers import notebook_exec

NOTEBOOKS = sorted(notebook_exec.COURSE.glob(notebook_exec.NOTEBOOK_GLOB))  # 00b and 10-12 too


def _tree(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from _tree(child)


def test_the_measurement_is_shown_beside_the_prediction_with_their_ratio(capsys):
    guess = predict("bytes all-reduced per step", unit="MB")
    guess.button.click()
    assert guess.answer.value == NOT_YET.replace("'", "&#x27;")  # before the measurement: nothing to show
    guess.box.value = 12.0  # the learner types
    line = guess.reveal(9.0)
    assert line == "bytes all-reduced per step: predicted 12 MB, measured 9 MB; measured / predicted = 0.75"
    assert line in capsys.readouterr().out  # printed below the measurement, whatever the frontend
    guess.button.click()
    assert guess.answer.value == line


def test_without_a_prediction_the_measurement_is_printed_alone(capsys):
    """What a headless run prints: nobody typed, the cell wrote no guess, and nothing waits for a click."""
    line = predict("time to resume", unit="s").reveal(1.5)
    assert "measured 1.5 s (no prediction" in line and "/ predicted" not in line
    written = predict("time to resume", unit="s", guess=3).reveal(1.5)  # a guess written in the cell
    assert written.endswith("measured / predicted = 0.50")
    assert predict("bubble", guess=0).reveal(0.2).endswith("undefined (the prediction was 0)")
    modelled = predict("all-reduce at W=4", unit="ms", guess=5).reveal(8.0, what="modelled")  # not a measurement
    assert "modelled 8 ms; modelled / predicted = 1.60" in modelled and "measured" not in modelled


def test_the_widget_has_no_output_widget():
    """No ``Output``: a cell showing it cannot meet the lost wake-up that tests/tiers/test_widget_cells.py stresses."""
    kinds = {type(w) for w in _tree(predict("x").widget)}
    assert widgets.FloatText in kinds and widgets.Button in kinds and widgets.Output not in kinds


@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_asks_before_its_key_measurements_and_reveals_after_them(source):
    """At least one prediction a notebook (before its key measurement, and before an exercise part that asks the
    learner to work something out first); each revealed once, with something run in between."""
    cells = [c.source for c in jupytext.read(source).cells if c.cell_type == "code"]
    asks = [i for i, c in enumerate(cells) if re.search(r"^\w+ = predict\(", c, re.M)]
    assert asks, f"{source.name}: no predict() cell"
    for ask in asks:
        name = re.search(r"^(\w+) = predict\(", cells[ask], re.M).group(1)
        reveals = [i for i, c in enumerate(cells) if f"{name}.reveal(" in c]
        assert len(reveals) == 1 and reveals[0] > ask + 1, f"{source.name}: no measurement between ask and reveal"
        assert not notebook_exec.is_widget_cell(cells[ask])  # not an Output cell: see the test above
