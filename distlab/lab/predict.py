"""Predict before you run: a guess typed in before a notebook's key measurement, then shown beside it.

A measurement read after writing a prediction teaches more than one read cold: the gap between the
two is what the learner's model of the system got wrong (the "predict, observe, explain" sequence of
physics education, White & Gunstone, *Probing Understanding*, 1992; Crouch et al., *Classroom
demonstrations: learning tools or entertainment?*, Am. J. Phys. 2004). Each notebook asks once::

    guess = predict("bytes all-reduced per step", unit="MB")   # before the measurement
    ...                                                         # the measurement's cells
    guess.reveal(measured_mb)                                   # after it

``predict`` shows a number box and a "show the measurement" button; ``reveal`` records the
measurement and prints it beside the prediction with their ratio, and from then on the button shows
the same line beside the box. A prediction can also be written in the cell (``guess=12``), which is
the one a non-interactive run (``tests/tiers/test_notebooks.py``, nbclient) uses, since nobody types there:
with none, ``reveal`` says so and prints the measurement alone. Nothing waits for a click, so a
headless run completes.

The widget has no ``ipywidgets.Output``: the button writes into an ``HTML`` widget's value. So
executing the cell never makes nbclient's Output-widget mimic send on the shell channel, the lost
wake-up ``tests/helpers/notebook_exec.py`` describes cannot occur here, and the cell is not one of the
widget cells ``tests/tiers/test_widget_cells.py`` stresses.
"""
from __future__ import annotations

import html
import math

import ipywidgets as widgets

NOT_YET = "run the measurement below first: this button then shows it beside your prediction"


class _Asking(widgets.VBox):
    """The widget; its text form (a saved notebook's ``text/plain``, a terminal) is the question, not a repr."""

    text = ""

    def __repr__(self) -> str:
        return self.text


class Prediction:
    """One prediction and, once :meth:`reveal` is called, the measurement it is compared with."""

    def __init__(self, question: str, unit: str = "", *, guess: float | None = None, fmt: str = ".3g"):
        self.question, self.unit, self.fmt = question, unit, fmt
        self.measured: float | None = None
        self.what = "measured"  # or "computed", "modelled": what the value compared with is, said as it is
        self.box = widgets.FloatText(value=0.0 if guess is None else float(guess),
                                     description="prediction", layout=widgets.Layout(width="16em"))
        self.typed = guess is not None  # a box still at 0.0 that nobody touched is no prediction
        self.box.observe(self._on_type, names="value")
        self.button = widgets.Button(description="show the measurement", icon="eye")
        self.button.on_click(self._on_click)
        self.answer = widgets.HTML()
        self.widget = _Asking([
            widgets.HTML(f"<b>Predict before you run:</b> {html.escape(question)}"
                         + (f" (in {html.escape(unit)})" if unit else "")),
            widgets.HBox([self.box, widgets.Label(unit), self.button]), self.answer])
        self.widget.text = repr(self)

    @property
    def guess(self) -> float | None:
        return float(self.box.value) if self.typed else None

    def _on_type(self, change: dict) -> None:
        self.typed = True

    def _on_click(self, _button: widgets.Button) -> None:
        self.answer.value = html.escape(NOT_YET if self.measured is None else self.comparison())

    def _value(self, x: float) -> str:
        return f"{x:{self.fmt}}" + (f" {self.unit}" if self.unit else "")

    def comparison(self) -> str:
        """The measurement beside the prediction, and measured / predicted (one line)."""
        if self.measured is None:
            return NOT_YET
        measured = f"{self.what} {self._value(self.measured)}"
        guess = self.guess
        if guess is None:
            return (f"{self.question}: {measured} (no prediction: type one in the box above, or write it in "
                    "the cell as guess=..., before running the measurement)")
        ratio = self.measured / guess if guess else math.inf
        return (f"{self.question}: predicted {self._value(guess)}, {measured}; {self.what} / predicted = "
                + (f"{ratio:.2f}" if math.isfinite(ratio) else "undefined (the prediction was 0)"))

    def reveal(self, measured: float, *, what: str = "measured") -> str:
        """Record the measurement, print it beside the prediction, and let the button show it too.

        ``what``: the word for the value where it is not a measurement ("computed" for arithmetic,
        "modelled" for a model's figure from measured inputs), so the line never calls it measured.
        """
        self.measured, self.what = float(measured), what
        line = self.comparison()
        print(line)
        return line

    def __repr__(self) -> str:  # where no widget can be shown (a plain Python session, a text export)
        return f"Predict before you run: {self.question}" + (f" (in {self.unit})" if self.unit else "")


def predict(question: str, unit: str = "", *, guess: float | None = None, fmt: str = ".3g") -> Prediction:
    """Ask for a prediction of ``question`` (in ``unit``) before the measurement: in IPython the widget is
    shown at once, elsewhere the question is printed.

    ``guess``: a prediction written in the cell instead of typed in the box (the one a headless run uses).
    ``fmt``: how both numbers are written (a format spec).
    """
    asked = Prediction(question, unit, guess=guess, fmt=fmt)
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(asked.widget)
    else:
        print(repr(asked))
    return asked
