"""Pictures: memory maps, bar charts of solver speed-ups, and learning curves from a run's logs."""

from __future__ import annotations

import csv
import os
from typing import TYPE_CHECKING, Optional, Sequence

import matplotlib

matplotlib.use("Agg")  # Headless: files only.
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.backend_bases import FigureCanvasBase  # noqa: E402
from matplotlib.collections import PatchCollection  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from malloczero.common.files import atomic_write, check_output_file  # noqa: E402
from malloczero.configs.workdir import WorkDir  # noqa: E402
from malloczero.env.hardware import Hardware  # noqa: E402
from malloczero.env.mapping import Mapping  # noqa: E402
from malloczero.env.workload import Workload  # noqa: E402

if TYPE_CHECKING:
  from malloczero.evaluation.suite import ProgramRow

SPLIT_COLOURS = {"train": "#4c72b0", "heldout": "#dd8452"}
KIND_COLOURS = {
  "activation": "#4c72b0",
  "parameter": "#dd8452",
  "input": "#55a868",
  "output": "#c44e52",
}

# Copies in flight, drawn over their allocation while its chunk waits for them (mapping files'
# `prefetch` / `eviction` windows).
COPY_HATCHES = {"prefetch": "////", "eviction": "\\\\\\\\"}


def address_unit(capacity_bytes: int) -> tuple[str, int]:
  """(unit, bytes per unit) in which a level of this size reads best: the largest of B, KiB, MiB
  and GiB that the capacity reaches (64 KiB is '64 KiB', not '0.06 MiB')."""
  for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if capacity_bytes >= scale:
      return unit, scale
  return "B", 1


def plot_memory_map(workload: Workload, hardware: Hardware, mapping: Mapping, path: str) -> None:
  """Time (ops) on x, address on y; one panel per fast level; rectangles coloured by kind."""
  plot_memory_maps(
    workload,
    hardware,
    [mapping],
    path,
    f"{workload.name} on {hardware.name} ({mapping.solver}): estimated speed-up "
    f"{mapping.speedup:.3f}x over all-slow",
  )


def plot_memory_maps(
  workload: Workload, hardware: Hardware, mappings: Sequence[Mapping], path: str, title: str
) -> None:
  """Several mappings of one program side by side: a column per mapping, a row per fast level."""
  _save(memory_map_figure(workload, hardware, mappings, title), path)


def memory_map_figure(
  workload: Workload, hardware: Hardware, mappings: Sequence[Mapping], title: str
):
  """The figure `plot_memory_maps` saves (the caller closes it)."""
  num_fast, columns = hardware.num_fast_levels, len(mappings)
  fig, axes = plt.subplots(
    num_fast,
    columns,
    figsize=(12 if columns == 1 else 8 * columns, 3.2 * num_fast + 0.6),
    squeeze=False,
  )
  size = {b.id: (hardware.align(b.size), b.kind) for b in workload.buffers}
  drawn, drawn_copies = set(), set()
  for column, mapping in enumerate(mappings):
    for level, ax in enumerate(axes[:, column]):
      lv = hardware.levels[level]
      unit, scale = address_unit(lv.capacity_bytes)
      rects, colours = [], []
      copies: dict[str, list[Rectangle]] = {kind: [] for kind in COPY_HATCHES}
      for a in mapping.allocations:
        if a["level"] != level:
          continue
        nbytes, kind = size[a["buffer"]]
        rects.append(
          Rectangle((a["start"], a["offset"] / scale), a["end"] - a["start"], nbytes / scale)
        )
        colours.append(KIND_COLOURS[kind])
        drawn.add(kind)
        for copy in COPY_HATCHES:  # The chunk is held while its copy is in flight.
          if copy in a:
            copies[copy].append(
              Rectangle(
                (a[copy]["start"], a["offset"] / scale),
                a[copy]["done"] - a[copy]["start"],
                nbytes / scale,
              )
            )
      ax.add_collection(
        PatchCollection(rects, facecolors=colours, edgecolors="black", linewidths=0.2, alpha=0.85)
      )
      for copy, hatch in COPY_HATCHES.items():
        if copies[copy]:
          ax.add_collection(
            PatchCollection(
              copies[copy], facecolors="none", edgecolors="black", linewidths=0.0, hatch=hatch
            )
          )
          drawn_copies.add(copy)
      ax.set_xlim(0, int(workload.time_axis[-1]))
      ax.set_ylim(0, lv.capacity_bytes / scale)
      ax.set_ylabel(f"{lv.name} address ({unit})")
      heading = (
        f"{lv.name}: {len(rects)} allocations, capacity {lv.capacity_bytes / scale:.4g} {unit}"
      )
      if columns > 1:
        heading = f"{mapping.solver} ({mapping.speedup:.3f}x) - {heading}"
      ax.set_title(heading, fontsize=9, loc="left")
    axes[-1, column].set_xlabel("program time (op index in schedule order)")
  if drawn:  # Only the kinds on the picture.
    handles = [Patch(color=c, label=k) for k, c in KIND_COLOURS.items() if k in drawn]
    handles += [
      Patch(facecolor="white", edgecolor="black", hatch=h, label=f"{k} in flight")
      for k, h in COPY_HATCHES.items()
      if k in drawn_copies
    ]
    fig.legend(
      handles=handles,
      loc="upper right",
      bbox_to_anchor=(0.99, 0.955 if num_fast == 1 else 0.975),
      ncol=len(handles),
      fontsize=8,
      frameon=False,
    )
  fig.suptitle(title, fontsize=11, x=0.01, ha="left")
  fig.tight_layout(rect=(0, 0, 1, 0.9 if num_fast == 1 else 0.95))
  return fig


def plot_speedups(rows: Sequence[ProgramRow], solvers: list[str], path: str, title: str) -> None:
  """A table as a picture: one row per suite entry, one column per solver, each cell the
  solver's speed-up over all-slow, coloured by its time relative to msa's (blue faster, red
  slower, white equal; clipped at 1.5x either way). Why not grouped bars: 56 entries x 9
  solvers made a picture 9,680 pixels wide that no one could read."""
  import matplotlib.cm as cm
  from matplotlib.colors import LogNorm

  speedups = np.array(
    [[r.outcomes[s].speedup if s in r.outcomes else np.nan for s in solvers] for r in rows]
  )  # [P, S]
  reference = np.array(
    [r.outcomes["msa"].speedup if "msa" in r.outcomes else np.nan for r in rows]
  )[:, None]
  relative = speedups / reference
  fig, ax = plt.subplots(figsize=(2.6 + 0.85 * len(solvers), 1.2 + 0.24 * len(rows)))
  norm = LogNorm(vmin=1 / 1.5, vmax=1.5)
  ax.imshow(
    np.clip(np.nan_to_num(relative, nan=1.0), 1 / 1.5, 1.5), cmap="RdBu", norm=norm, aspect="auto"
  )
  for i in range(len(rows)):
    for j in range(len(solvers)):
      if np.isfinite(speedups[i, j]):
        dark = np.isfinite(relative[i, j]) and abs(np.log(relative[i, j])) > np.log(1.3)
        ax.text(
          j,
          i,
          f"{speedups[i, j]:.2f}",
          ha="center",
          va="center",
          fontsize=6.5,
          color="white" if dark else "black",
        )
  ax.set_xticks(np.arange(len(solvers)))
  ax.set_xticklabels(solvers, fontsize=8, rotation=30, ha="right")
  ax.xaxis.tick_top()
  ax.set_yticks(np.arange(len(rows)))
  ax.set_yticklabels([f"{r.entry} ({r.split})" for r in rows], fontsize=7)
  colourbar = fig.colorbar(cm.ScalarMappable(norm=norm, cmap="RdBu"), ax=ax, shrink=0.4, pad=0.02)
  ticks = [1 / 1.5, 0.8, 1.0, 1.25, 1.5]
  colourbar.set_ticks(ticks)
  colourbar.set_ticklabels([f"{t:.2f}" for t in ticks])
  colourbar.ax.minorticks_off()
  colourbar.set_label("msa time / its time", fontsize=8)
  ax.set_title(f"{title}\nspeed-up over all-slow; colour: against msa", fontsize=9)
  fig.tight_layout()
  _save(fig, path)


def plot_ratio_bars(rows: Sequence[ProgramRow], solver: str, path: str, title: str) -> None:
  """Per program, `solver`'s time relative to msa's (msa time / solver time), best first."""
  rows = sorted(rows, key=lambda r: -r.outcomes[solver].vs_msa)
  colours = [SPLIT_COLOURS.get(r.split, "grey") for r in rows]
  fig, ax = plt.subplots(figsize=(max(8, 0.22 * len(rows) + 3), 4.8))
  x = np.arange(len(rows))
  ax.bar(x, [r.outcomes[solver].vs_msa - 1 for r in rows], 0.8, bottom=1, color=colours)
  ax.axhline(1.0, color="black", linewidth=0.8)
  ax.set_xticks(x)
  ax.set_xticklabels([r.entry for r in rows], rotation=70, ha="right", fontsize=7)
  ax.set_xlim(-0.6, len(rows) - 0.4)
  ax.set_ylabel("msa time / its time")
  ax.set_title(title, fontsize=10)
  ax.legend(
    handles=[
      Patch(color=c, label=s) for s, c in SPLIT_COLOURS.items() if any(r.split == s for r in rows)
    ],
    fontsize=8,
  )
  ax.grid(axis="y", alpha=0.3)
  fig.tight_layout()
  _save(fig, path)


def _read_csv(path: str) -> list[dict[str, str]]:
  if not os.path.isfile(path):
    return []
  with open(path, encoding="utf-8") as f:
    return list(csv.DictReader(f))


def _step_and_loss(row: dict[str, str]) -> Optional[tuple[int, float]]:
  """None for a row without a loss, or the last line of a log the learner is still writing."""
  try:
    return int(float(row["learner_steps"])), float(row["loss"])
  except (KeyError, TypeError, ValueError):
    return None


def plot_learning_curves(
  workdirs: dict[str, str], references: dict[str, dict[str, float]], path: str, title: str
) -> Optional[str]:
  """From each run's logs: the evaluated speed-up (learning_curve.csv: the evaluation search's,
  and the policy alone's where the curve has it) and the learner's loss
  (logs/learner/logs.csv) against learner steps. `references` is {split: {solver: geomean}},
  drawn as horizontal lines. Returns None (and draws nothing) when no run has logs."""
  curves = {label: _read_csv(WorkDir(d).learning_curve_csv) for label, d in workdirs.items()}
  losses = {label: _read_csv(WorkDir(d).log_csv("learner")) for label, d in workdirs.items()}
  if not any(curves.values()) and not any(losses.values()):
    return None
  fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7.5), sharex=True)
  styles = ["o-", "s--", "^-.", "d:"]
  for i, (label, rows) in enumerate(curves.items()):
    for split in SPLIT_COLOURS:
      points = [
        (int(r["learner_steps"]), float(r["geomean_speedup"])) for r in rows if r["split"] == split
      ]
      if points:
        top.plot(
          *zip(*sorted(points)),
          styles[i % len(styles)],
          color=SPLIT_COLOURS[split],
          markersize=4,
          label=f"{label} ({split})",
        )
      policy = [
        (int(r["learner_steps"]), float(r["policy_geomean_speedup"]))
        for r in rows
        if r["split"] == split and r.get("policy_geomean_speedup")
      ]
      if policy:  # The network's policy alone: hollow markers, thin line.
        top.plot(
          *zip(*sorted(policy)),
          styles[i % len(styles)],
          color=SPLIT_COLOURS[split],
          markersize=5,
          markerfacecolor="none",
          linewidth=0.8,
          alpha=0.8,
          label=f"{label} ({split}, policy alone)",
        )
  for split, solvers in references.items():
    for solver, style in zip(solvers, ("--", (0, (5, 1, 1, 1)), ":", "-.")):
      top.axhline(
        solvers[solver],
        linestyle=style,
        linewidth=1,
        alpha=0.7,
        color=SPLIT_COLOURS.get(split, "grey"),
        label=f"{solver} ({split})",
      )
  top.set_ylabel("geomean speed-up over all-slow")
  top.set_title(title, fontsize=10)
  top.legend(fontsize=7, ncol=2)
  top.grid(alpha=0.3)
  for i, (label, rows) in enumerate(losses.items()):
    points = sorted(p for p in map(_step_and_loss, rows) if p is not None)
    if points:
      steps, values = map(np.asarray, zip(*points))
      window = max(1, len(values) // 50)
      smooth = np.convolve(values, np.ones(window) / window, mode="valid")
      bottom.plot(steps[window - 1 :], smooth, styles[i % len(styles)][1:] or "-", label=label)
  bottom.set_xlabel("learner steps")
  bottom.set_ylabel("learner loss (smoothed)")
  bottom.grid(alpha=0.3)
  if any(losses.values()):
    bottom.legend(fontsize=7)
  fig.tight_layout()
  _save(fig, path)
  return path


def picture_formats() -> tuple[str, ...]:
  """The file extensions matplotlib can write (png, svg, pdf, ...); not pgf, which needs LaTeX
  installed to measure text and would fail only once the picture is drawn."""
  return tuple(sorted(set(FigureCanvasBase.get_supported_filetypes()) - {"pgf"}))


def check_picture_path(path: str, what: str = "--plot") -> str:
  """`check_output_file` plus an extension matplotlib can write; raises OutputError."""
  return check_output_file(path, what, extensions=picture_formats())


def _save(fig, path: str) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  extension = os.path.splitext(path)[1].lstrip(".").lower()
  try:
    with atomic_write(path, "wb") as f:  # The format is named: a file object has no extension.
      fig.savefig(f, format=extension if extension in picture_formats() else "png", dpi=110)
  finally:
    plt.close(fig)
