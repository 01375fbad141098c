"""The throughput benchmark's tables: rates and ratios per writer and input, median (min-max).

A figure is the median over the rounds after the first (the first warms up the JVM and the
Python workers; with one round, that round), with the spread; a ratio is taken round by round,
between writers that ran in the same Spark application, then summarised the same way.
"""

from __future__ import annotations

import statistics
from typing import Any

from kafka_txn_sink.testing import newest_spark_line

NEWEST = newest_spark_line()

Rates = dict[tuple[str, str, str], list[float]]  # (line, input, writer) -> rows/s per round
# (line, input, writer) -> per round, CPU microseconds a row: (the machine's, the broker's)
Costs = dict[tuple[str, str, str], list[tuple[float, float]]]

# (name, top, bottom, {line: target}): issue 43's targets (4.0's against Spark's Kafka sink
# is for the narrow shape), issue 16's for the partitioned files and payload, issue 27's Avro.
RATIOS = [
    ("records / Spark Kafka", "records", "kafka", {"4.0": 1.0, NEWEST: 1.2}),
    ("records / floor", "records", "floor", {"4.0": 0.9, NEWEST: 0.9}),
    ("floor / Spark Kafka", "floor", "kafka", {}),
    ("files / Spark Avro", "files", "avro", {NEWEST: 1.0}),
    ("files / Spark Avro, partitioned", "files_p", "avro_p", {NEWEST: 0.8}),
    ("files S3 / Spark Avro", "files_s3", "avro", {}),
    ("files S3 / Spark Avro, partitioned", "files_s3_p", "avro_p", {}),
    ("payload / Spark Avro", "payload", "avro", {NEWEST: 0.5}),
    ("records Avro / records", "records_avro", "records", {NEWEST: 0.6}),  # issue 27
]


def counted(values: list[float]) -> list[float]:
    """The rounds a figure is taken from: all after the first, or the only one."""
    return values[1:] or values


def figure(values: list[float], digits: int = 0) -> str:
    """`median (min-max)` of the counted rounds."""
    kept = counted(values)
    if not kept:
        return ""
    form = f"{{:,.{digits}f}}"
    median = form.format(statistics.median(kept))
    if len(kept) == 1:
        return median
    return f"{median} ({form.format(min(kept))}-{form.format(max(kept))})"


def rate_table(
    rates: Rates, tags: list[str], cells: list[str], labels: dict[str, str]
) -> list[str]:
    """Rows/s per line, writer (`labels`: key -> label) and input, median (min-max)."""
    out = [
        "| Spark | writer | " + " | ".join(cells) + " |",
        "|---|---|" + "---|" * len(cells),
    ]
    for tag in tags:
        for key, label in labels.items():
            row = [figure(rates.get((tag, cell, key), [])) for cell in cells]
            if any(row):
                out.append(f"| {tag} | {key}: {label} | " + " | ".join(row) + " |")
    return out


def round_ratios(rates: Rates, line: str, cell: str, top: str, bottom: str) -> list[float]:
    """top / bottom round by round (both ran in the same application)."""
    tops, bottoms = rates.get((line, cell, top), []), rates.get((line, cell, bottom), [])
    return [t / b for t, b in zip(tops, bottoms, strict=False) if b]


def ratio_table(rates: Rates, tags: list[str], cells: list[str]) -> list[str]:
    """The ratios of RATIOS per line and input, with their targets, met or not."""
    out = [
        "| Spark | ratio | target | " + " | ".join(cells) + " |",
        "|---|---|---|" + "---|" * len(cells),
    ]
    for tag in tags:
        for name, top, bottom, targets in RATIOS:
            values = [round_ratios(rates, tag, cell, top, bottom) for cell in cells]
            if not any(values):
                continue
            target = targets.get(tag)
            row = [verdict(figure(v, 2), v, target) for v in values]
            aim = f">= {target}" if target else ""
            out.append(f"| {tag} | {name} | {aim} | " + " | ".join(row) + " |")
    return out


def verdict(text: str, values: list[float], target: float | None) -> str:
    """`text`, marked met or not when there is a target and a value."""
    if not text or target is None:
        return text
    return f"{text} {'met' if statistics.median(counted(values)) >= target else 'NOT met'}"


def cpu_table(costs: Costs, tags: list[str], cells: list[str]) -> list[str]:
    """CPU per row of each query, whole queries (start and every batch), median (min-max):
    the machine's busy CPU (Spark, its Python workers, the broker, the rest), then the broker's
    part of it and the rest."""
    out = [
        "\nCPU microseconds a row, whole query: the machine / of it the broker / the rest",
        "| Spark | writer | " + " | ".join(cells) + " |",
        "|---|---|" + "---|" * len(cells),
    ]
    writers = sorted({key for (_, _, key) in costs})
    for tag in tags:
        for key in writers:
            row = []
            for cell in cells:
                rounds = costs.get((tag, cell, key), [])
                machine, broker = [m for m, _ in rounds], [b for _, b in rounds]
                rest = [m - b for m, b in rounds]
                parts = (figure(machine, 1), figure(broker, 1), figure(rest, 1))
                row.append(" / ".join(parts) if rounds else "")
            if any(row):
                out.append(f"| {tag} | {key} | " + " | ".join(row) + " |")
    return out


def memory_table(tag: str, peaks: dict[str, dict[int, int]]) -> list[str]:
    """Peak RSS at 1x and 16x the rows, per mode."""
    out = [
        f"\nexecutor Python worker peak RSS, one partition, PySpark {tag}:",
        "| mode | rows 1x | peak RSS 1x | rows 16x | peak RSS 16x | 16x / 1x (target <= 1.1) |",
        "|---|---|---|---|---|---|",
    ]
    for mode, by_rows in peaks.items():
        (r1, p1), (r16, p16) = sorted(by_rows.items())
        out.append(
            f"| {mode} | {r1:,} | {p1 / 1024:.0f} MiB | {r16:,} | {p16 / 1024:.0f} MiB "
            f"| {p16 / p1:.2f} |"
        )
    return out


def throughput_chart(
    rates: Rates, tags: list[str], cells: list[str], labels: dict[str, str], path: str
) -> None:
    """Per Spark line, two panels side by side: rows/s per writer (`labels`: key -> label)
    and input, and the ratios of RATIOS with their targets; bars are medians of the counted
    rounds with min-max whiskers. Written as an SVG file (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(tags), 2, figsize=(16, 4 * len(tags)), squeeze=False)
    for row, tag in zip(axes, tags, strict=True):
        rate_panel(row[0], rates, tag, cells, labels)
        ratio_panel(row[1], rates, tag, cells)
    figure.tight_layout()
    figure.savefig(path)
    print(f"chart: {path}")


def rate_panel(axis: Any, rates: Rates, tag: str, cells: list[str], labels: dict[str, str]) -> None:
    """Rows/s of each writer that ran, grouped by input."""
    writers = [k for k in labels if any(counted(rates.get((tag, c, k), [])) for c in cells)]
    width = 0.8 / max(len(writers), 1)
    for i, key in enumerate(writers):
        kept = [counted(rates.get((tag, cell, key), [])) for cell in cells]
        medians = [statistics.median(k) / 1000 if k else 0.0 for k in kept]
        spread = [
            [m - min(k) / 1000 if k else 0.0 for m, k in zip(medians, kept, strict=True)],
            [max(k) / 1000 - m if k else 0.0 for m, k in zip(medians, kept, strict=True)],
        ]
        positions = [x + (i - (len(writers) - 1) / 2) * width for x in range(len(cells))]
        axis.bar(positions, medians, width, yerr=spread, capsize=2, label=labels[key])
    axis.set_xticks(list(range(len(cells))), cells, fontsize=8)
    axis.set_ylabel("thousand rows/s")
    axis.set_title(f"Spark {tag}: rows/s per writer, median of rounds", fontsize=9)
    axis.legend(fontsize=7)


def ratio_panel(axis: Any, rates: Rates, tag: str, cells: list[str]) -> None:
    """The ratios of RATIOS that have figures, each with its target as a red line."""
    labels, medians, lows, highs, aims = [], [], [], [], []
    for name, top, bottom, targets in RATIOS:
        for cell in cells:
            kept = counted(round_ratios(rates, tag, cell, top, bottom))
            if not kept:
                continue
            median = statistics.median(kept)
            labels.append(f"{name}\n{cell}")
            medians.append(median)
            lows.append(median - min(kept))
            highs.append(max(kept) - median)
            aims.append(targets.get(tag))
    positions = range(len(labels))
    axis.bar(positions, medians, yerr=[lows, highs], capsize=3)
    for x, aim in zip(positions, aims, strict=True):
        if aim is not None:
            axis.plot([x - 0.4, x + 0.4], [aim, aim], color="red")
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.set_xticks(list(positions), labels, rotation=30, ha="right", fontsize=7)
    axis.set_title(f"Spark {tag}: ratios, median of rounds (red: target)", fontsize=9)
