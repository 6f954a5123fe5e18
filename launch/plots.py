"""Pictures: the memory map of one mapping, and bar charts of solver speed-ups."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")  # Headless: files only.
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import PatchCollection  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from env.hardware import Hardware  # noqa: E402
from env.mapping import Mapping  # noqa: E402
from env.workload import Workload  # noqa: E402

KIND_COLOURS = {"activation": "#4c72b0", "parameter": "#dd8452", "input": "#55a868",
                "output": "#c44e52"}


def plot_memory_map(workload: Workload, hardware: Hardware, mapping: Mapping, path: str) -> None:
  """Time (ops) on x, address on y; one panel per fast level; rectangles coloured by kind."""
  num_fast = hardware.num_fast_levels
  fig, axes = plt.subplots(num_fast, 1, figsize=(12, 3.2 * num_fast + 0.6), squeeze=False)
  size = {b.id: (hardware.align(b.size), b.kind) for b in workload.buffers}
  for level, ax in enumerate(axes[:, 0]):
    lv = hardware.levels[level]
    rects, colours = [], []
    for a in mapping.allocations:
      if a["level"] != level:
        continue
      nbytes, kind = size[a["buffer"]]
      rects.append(Rectangle((a["start"], a["offset"] / 2**20), a["end"] - a["start"],
                             nbytes / 2**20))
      colours.append(KIND_COLOURS[kind])
    ax.add_collection(PatchCollection(rects, facecolors=colours, edgecolors="black",
                                      linewidths=0.2, alpha=0.85))
    ax.set_xlim(0, workload.num_ops)
    ax.set_ylim(0, lv.capacity_bytes / 2**20)
    ax.set_ylabel(f"{lv.name} address (MiB)")
    ax.set_title(f"{lv.name}: {len(rects)} allocations, capacity {lv.capacity_bytes / 2**20:.2f} MiB",
                 fontsize=9, loc="left")
  axes[-1, 0].set_xlabel("program time (op index in schedule order)")
  fig.legend(handles=[Patch(color=c, label=k) for k, c in KIND_COLOURS.items() if k != "output"],
             loc="upper right", bbox_to_anchor=(0.99, 0.955 if num_fast == 1 else 0.975),
             ncol=3, fontsize=8, frameon=False)
  fig.suptitle(f"{workload.name} on {hardware.name} ({mapping.solver}): estimated speed-up "
               f"{mapping.speedup:.3f}x over all-slow", fontsize=11, x=0.01, ha="left")
  fig.tight_layout(rect=(0, 0, 1, 0.9 if num_fast == 1 else 0.95))
  _save(fig, path)


def plot_speedups(rows: list[dict], solvers: list[str], path: str, title: str) -> None:
  """Grouped bars: per suite entry, each solver's speed-up over all-slow."""
  import numpy as np
  entries = [r["entry"] for r in rows]
  width = 0.8 / max(1, len(solvers))
  fig, ax = plt.subplots(figsize=(max(8, 0.5 * len(entries) * max(1, len(solvers)) ** 0.5 + 4), 5))
  x = np.arange(len(entries))
  for i, s in enumerate(solvers):
    ax.bar(x + i * width - 0.4 + width / 2, [r.get(f"{s}_speedup", np.nan) for r in rows], width,
           label=s)
  ax.axhline(1.0, color="black", linewidth=0.6)
  ax.set_xticks(x)
  ax.set_xticklabels(entries, rotation=60, ha="right", fontsize=7)
  ax.set_ylabel("speed-up over all-slow")
  ax.set_title(title)
  ax.legend(fontsize=8)
  fig.tight_layout()
  _save(fig, path)


def _save(fig, path: str) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
