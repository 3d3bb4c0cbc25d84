"""The training recipe's ``curves.png``: the train loss, its points coloured by step kind (hot or cold),
and the validation AUC, with another run's (``--compare``, such as a baseline) drawn beside them.

Drawn on ``matplotlib.figure.Figure`` without pyplot, so that no backend is chosen or changed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes

#: The history lists a run's ``metrics.json`` must hold for its curves to be drawn.
CURVES = ("step", "loss", "eval_step", "auc")


def compared_run(path: str) -> dict:
    """The metrics of the run ``--compare`` names: its ``metrics.json``, or the ``--out`` folder holding
    one; ``ValueError`` naming the option and the file unless it holds a run's curves."""
    file = Path(path) / "metrics.json" if Path(path).is_dir() else Path(path)
    try:
        metrics = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"--compare {path}: cannot read {file} as a run's metrics.json ({error})") from error
    history = metrics.get("history") if isinstance(metrics, dict) else None
    missing = [
        key for key in CURVES if not isinstance(history, dict) or not isinstance(history.get(key), list)
    ]
    if missing:
        raise ValueError(
            f"--compare {path}: {file} is not a training run's metrics.json (no history {', '.join(missing)})"
        )
    return metrics


def plot_curves(metrics: dict, path: str | Path, compared: dict | None = None) -> None:
    """``metrics``' train loss (its hot and cold steps' points, above a moving mean) and validation AUC,
    with ``compared``'s (another run's metrics) in grey."""
    import numpy as np  # the options check --compare with json alone: not numpy, not for --help
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    left, right = fig.subplots(1, 2)
    history = metrics["history"]
    steps, losses = np.asarray(history["step"]), np.asarray(history["loss"], dtype=float)
    hot = np.asarray(history.get("hot", []), dtype=bool)
    if len(hot) == len(losses):  # a run resumed from an older checkpoint has no kinds to show
        for kind, chosen, colour in (("hot", hot, "tab:orange"), ("cold", ~hot, "tab:blue")):
            if chosen.any():
                left.scatter(steps[chosen], losses[chosen], s=14 if len(losses) < 500 else 6, alpha=0.7,
                             color=colour, lw=0, zorder=3,
                             label=f"{kind} steps ({np.count_nonzero(chosen):,})")  # fmt: skip
    window = _loss_curve(left, history, "k", f"{metrics['mode']}, moving mean")
    right.plot(history["eval_step"], history["auc"], marker="o", color="k", label=metrics["mode"])
    if compared is not None:
        name = f"{compared.get('mode', 'compared')} (--compare)"
        _loss_curve(left, compared["history"], "tab:gray", f"{name}, moving mean")
        right.plot(compared["history"]["eval_step"], compared["history"]["auc"], marker="s",
                   color="tab:gray", label=name)  # fmt: skip
    left.set_xlabel("step")
    left.set_ylabel(f"train loss (moving mean of {window} steps)")
    left.legend(fontsize=7, markerscale=2)
    right.set_xlabel("step")
    right.set_ylabel("validation AUC")
    right.legend(fontsize=7)
    fig.suptitle(f"{metrics['model']}, {metrics['mode']}, {metrics['world_size']} rank(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _loss_curve(ax: Axes, history: dict, colour: str, label: str) -> int:
    """The moving mean of ``history``'s train loss over a 50th of its steps; the window."""
    import numpy as np

    losses = np.asarray(history["loss"], dtype=float)
    window = max(1, len(losses) // 50)
    if len(losses):
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(history["step"][window - 1 :], smooth, color=colour, lw=0.8, zorder=2, label=label)
    return window
