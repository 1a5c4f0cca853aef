"""The planner's front end (notebook 12): a model, a cluster and a batch in, :func:`distlab.lab.planner.plan`'s
table out, redrawn on every change.

Like :mod:`distlab.lab.predict`, the widget has no ``ipywidgets.Output``: each change rewrites an ``HTML``
widget's value, so executing the cell never makes nbclient's Output-widget mimic send on the shell
channel (the lost wake-up ``tests/helpers/notebook_exec.py`` describes), and a headless run prints the same
table as text.
"""
from __future__ import annotations

import html

import ipywidgets as widgets

from distlab.lab.activation_memory import PRESETS, RECOMPUTE
from distlab.lab.planner import Cluster, Model, Training, plan
from distlab.lab.training_memory import OPTIMIZER_STATES, PRECISIONS

GB = 1e9
#: The model presets: activation_memory's shapes, with a vocabulary and a sequence.
MODELS = {name: Model(layers=s["layers"], hidden=s["hidden"], heads=s["heads"], seq=4096, vocab=50257 if "GPT" in
                      name else 32000) for name, s in PRESETS.items()}
COLUMNS = ("layout", "memory / GPU", "of which activations", "fits", "sent / step", "by degree", "comm time",
           "bubble", "step time")
#: Two nodes of eight H100s: NVLink's and a 400 Gb/s NIC per GPU's all-reduce bus bandwidths, bf16's dense peak.
H100_NODES = Cluster(gpus=16, memory=80 * GB, bandwidth=360 * GB, latency=5e-6, gpus_per_node=8,
                     inter_bandwidth=45 * GB, inter_latency=10e-6, peak_flops=989e12, efficiency=0.4)


def _gb(x: float) -> str:
    return f"{x / GB:.3g} GB" if x >= 1e7 else f"{x / 1e3:.4g} kB"


def _seconds(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def rows_of(model: Model, cluster: Cluster, training: Training, top: int = 10) -> list[tuple[str, ...]]:
    """The first ``top`` layouts of :func:`~distlab.lab.planner.plan`, as the table's cells."""
    out = []
    for r in plan(model, cluster, training)[:top]:
        mem = r["memory"]
        out.append((str(r["layout"]), _gb(mem["total"]), _gb(mem["activations"]), "yes" if r["fits"] else "no",
                    _gb(r["comm_bytes"]), ", ".join(f"{d} {_gb(b)}" for d, b in r["comm_by_dim"].items()) or "-",
                    _seconds(r["comm_s"]), f"{r['bubble']:.0%}",
                    _seconds(r["time"]["step"]) if cluster.peak_flops > 0 else "-"))
    return out


def as_text(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)] if rows else []
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in [COLUMNS, *rows]]
    return "\n".join(lines) if rows else "no layout: the degrees cannot divide this model or batch"


def as_html(rows: list[tuple[str, ...]]) -> str:
    if not rows:
        return f"<i>{html.escape(as_text(rows))}</i>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


class _Shown(widgets.VBox):
    """The widget; its text form (a saved notebook's ``text/plain``, a terminal) is the table, not a repr."""

    planner = None

    def __repr__(self) -> str:
        return repr(self.planner)


class Planner:
    """The controls and the table; :meth:`inputs` reads them, :meth:`update` redraws."""

    def __init__(self, model: Model, cluster: Cluster, training: Training, top: int = 10):
        self.top, self.inter_latency = top, cluster.inter_latency  # no control of its own: kept as given
        box = lambda v, d: widgets.IntText(value=v, description=d, layout=widgets.Layout(width="14em"))  # noqa: E731
        real = lambda v, d: widgets.FloatText(value=v, description=d, layout=widgets.Layout(width="14em"))  # noqa: E731
        self.model = {k: box(getattr(model, k), k) for k in ("layers", "hidden", "heads", "seq", "vocab",
                                                             "mlp_ratio", "positions", "experts", "top_k")}
        self.cluster = {"gpus": box(cluster.gpus, "GPUs"), "memory": real(cluster.memory / GB, "GB / GPU"),
                        "bandwidth": real(cluster.bandwidth / GB, "GB/s link"),
                        "latency": real(cluster.latency * 1e6, "latency µs"),
                        "gpus_per_node": box(cluster.gpus_per_node, "GPUs / node"),
                        "inter_bandwidth": real(cluster.inter_bandwidth / GB, "GB/s network"),
                        "peak_flops": real(cluster.peak_flops / 1e12, "peak TFLOP/s"),
                        "efficiency": real(cluster.efficiency, "efficiency")}
        self.training = {"batch": box(training.batch, "batch"),
                         "micro_batches": box(training.micro_batches, "micro-batches"),
                         "precision": widgets.Dropdown(options=list(PRECISIONS), value=training.precision,
                                                       description="precision"),
                         "optimizer": widgets.Dropdown(options=list(OPTIMIZER_STATES), value=training.optimizer,
                                                       description="optimizer"),
                         "recompute": widgets.Dropdown(options=list(RECOMPUTE), value=training.recompute,
                                                       description="recompute"),
                         "sp": widgets.Checkbox(value=training.sp, description="sequence parallel")}
        self.table = widgets.HTML()
        controls = [*self.model.values(), *self.cluster.values(), *self.training.values()]
        for c in controls:
            c.observe(lambda _change: self.update(), names="value")
        grid = widgets.GridBox(controls, layout=widgets.Layout(grid_template_columns="repeat(4, 15em)"))
        self.widget = _Shown([grid, self.table])
        self.widget.planner = self
        self.update()

    def inputs(self) -> tuple[Model, Cluster, Training]:
        c = {k: w.value for k, w in self.cluster.items()}
        cluster = Cluster(gpus=max(1, c["gpus"]), memory=c["memory"] * GB, bandwidth=max(c["bandwidth"], 1e-9) * GB,
                          latency=c["latency"] * 1e-6, gpus_per_node=max(0, c["gpus_per_node"]),
                          inter_bandwidth=max(c["inter_bandwidth"], 0) * GB, inter_latency=self.inter_latency,
                          peak_flops=max(c["peak_flops"], 0) * 1e12, efficiency=min(max(c["efficiency"], 0.01), 1))
        return (Model(**{k: w.value for k, w in self.model.items()}), cluster,
                Training(**{k: w.value for k, w in self.training.items()}))

    def rows(self) -> list[tuple[str, ...]]:
        return rows_of(*self.inputs(), top=self.top)

    def update(self) -> None:
        try:
            self.table.value = as_html(self.rows())
        except (ValueError, ZeroDivisionError) as exc:  # a half-typed number: say so, keep the controls
            self.table.value = f"<i>{html.escape(str(exc))}</i>"

    def __repr__(self) -> str:
        return as_text(self.rows())


def planner(model: Model | None = None, cluster: Cluster | None = None, training: Training | None = None,
            top: int = 10) -> Planner:
    """Show the planner (in IPython the widget, elsewhere the table as text); defaults: Llama-2 7B's shape
    on 8 GPUs of 80 GB, 100 GB/s links and 5 µs a ring step, 16 sequences in 4 micro-batches, bf16 and Adam."""
    shown = Planner(model or MODELS["Llama-2 7B"], cluster or Cluster(gpus=8, memory=80 * GB, bandwidth=100 * GB,
                                                                       latency=5e-6),
                    training or Training(batch=16, micro_batches=4), top=top)
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(shown.widget)
    else:
        print(repr(shown))
    return shown
