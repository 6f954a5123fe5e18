"""`malloczero evaluate`: every solver on every entry of a suite; a table, CSV, JSON, Markdown, PNG."""

from __future__ import annotations

import csv
import json
import os
import time
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from env.mapping import geomean
from env.solvers import solve
from env.suites import Suite


def evaluate_suite(suite: Suite, solvers: list[str], options: Callable[[str], dict],
                   console: Console) -> list[dict[str, Any]]:
  """One row per entry: times in ms, speed-ups over all-slow and over msa, CP-SAT status."""
  rows = []
  with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), console=console, transient=False) as progress:
    task = progress.add_task("evaluating", total=len(suite.entries) * len(solvers))
    for entry in suite.entries:
      workload, hardware = entry.load()
      row: dict[str, Any] = {"entry": entry.name, "split": entry.split, "model": entry.model,
                             "hardware": entry.hardware,
                             "capacity_fraction": entry.capacity_fraction,
                             "fast_capacity_bytes": hardware.levels[0].capacity_bytes,
                             "ops": workload.num_ops, "buffers": workload.num_buffers}
      for solver in solvers:
        progress.update(task, description=f"{entry.name}: {solver}")
        result = solve(workload, hardware, solver, **options(solver))
        m = result.mapping
        row["requests"] = result.info["requests"]
        row["slow_only_ms"] = m.slow_only_time_s * 1e3
        row[f"{solver}_ms"] = m.estimated_time_s * 1e3
        row[f"{solver}_speedup"] = m.speedup
        row[f"{solver}_solve_s"] = result.solve_time_s
        if solver == "cpsat":
          row["cpsat_status"] = result.info["status"] + (" (msa fallback)"
                                                         if "fallback" in result.info else "")
          bound = result.info["bound_s"] * 1e3
          row["cpsat_bound_ms"] = bound
          # Clamped: the bound is exact only up to CP-SAT's integer rounding (1e-9 of all-slow).
          row["cpsat_gap"] = max(0.0, (m.estimated_time_s * 1e3 - bound) / (m.estimated_time_s * 1e3))
        progress.advance(task)
      if "msa" in solvers:
        for solver in solvers:
          row[f"{solver}_vs_msa"] = row["msa_ms"] / row[f"{solver}_ms"]
      rows.append(row)
  return rows


def summarise(rows: list[dict[str, Any]], solvers: list[str]) -> dict[str, Any]:
  """Geometric-mean speed-ups, and how often / by how much each solver beats msa."""
  summary: dict[str, Any] = {"entries": len(rows)}
  for solver in solvers:
    speedups = [r[f"{solver}_speedup"] for r in rows]
    summary[f"{solver}_geomean_speedup"] = geomean(speedups)
    if rows and solver != "msa" and f"{solver}_vs_msa" in rows[0]:
      vs = [r[f"{solver}_vs_msa"] for r in rows]
      summary[f"{solver}_geomean_vs_msa"] = geomean(vs)
      summary[f"{solver}_beats_msa"] = sum(v > 1 + 1e-9 for v in vs)
      summary[f"{solver}_best_vs_msa"] = max(vs)
    summary[f"{solver}_total_solve_s"] = sum(r[f"{solver}_solve_s"] for r in rows)
  if rows and "cpsat_status" in rows[0]:
    summary["cpsat_optimal"] = sum(r["cpsat_status"] == "optimal" for r in rows)
  return summary


def _columns(solvers: list[str]) -> list[tuple[str, str, Callable[[Any], str]]]:
  ms = lambda v: f"{v * 1e3:.4g} us" if v < 0.1 else f"{v:.4g} ms"
  x = lambda v: f"{v:.3f}x"
  cols = [("entry", "entry", str), ("split", "split", str), ("requests", "requests", str),
          ("slow_only_ms", "all-slow", ms)]
  for s in solvers:
    cols.append((f"{s}_ms", f"{s} time", ms))
    if s != "msa":
      cols.append((f"{s}_vs_msa", f"{s} vs msa", x))
  if "cpsat" in solvers:
    cols += [("cpsat_status", "CP-SAT", str), ("cpsat_bound_ms", "bound", ms),
             ("cpsat_gap", "gap", lambda v: f"{100 * v:.2f}%")]
  cols += [(f"{s}_solve_s", f"{s} s", lambda v: f"{v:.2f}") for s in solvers]
  return [c for c in cols if not c[0].endswith("_vs_msa") or "msa" in solvers]


def print_table(rows, solvers, summary, console: Console, title: str) -> None:
  table = Table(title=title, show_lines=False)
  cols = _columns(solvers)
  longest = max((len(r["entry"]) for r in rows), default=5)
  for _, header, _ in cols:
    if header == "entry":  # Never truncated: other columns wrap instead.
      table.add_column(header, no_wrap=True, min_width=longest)
    else:
      table.add_column(header, justify="left" if header in ("split", "CP-SAT") else "right")
  for r in rows:
    table.add_row(*[fmt(r[key]) if key in r else "" for key, _, fmt in cols])
  console.print(table)
  for key, value in summary.items():
    console.print(f"  {key}: {value:.4g}" if isinstance(value, float) else f"  {key}: {value}")


def write_outputs(rows, solvers, summary, out_dir: str, title: str) -> list[str]:
  from launch.plots import plot_speedups
  os.makedirs(out_dir, exist_ok=True)
  paths = {k: os.path.join(out_dir, f"evaluation.{k}") for k in ("csv", "json", "md", "png")}
  keys = list(dict.fromkeys(k for r in rows for k in r))
  with open(paths["csv"], "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
  with open(paths["json"], "w", encoding="utf-8") as f:
    json.dump({"title": title, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "solvers": solvers,
               "summary": summary, "rows": rows}, f, indent=1)
  cols = _columns(solvers)
  lines = [f"# {title}", "", "| " + " | ".join(h for _, h, _ in cols) + " |",
           "|" + "|".join("---" for _ in cols) + "|"]
  for r in rows:
    lines.append("| " + " | ".join(fmt(r[k]) if k in r else "" for k, _, fmt in cols) + " |")
  lines += ["", "## Summary", ""] + [f"- {k}: {v:.4g}" if isinstance(v, float) else f"- {k}: {v}"
                                     for k, v in summary.items()]
  with open(paths["md"], "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  plot_speedups(rows, solvers, paths["png"], title)
  return list(paths.values())
