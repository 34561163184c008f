"""`bench --vs-llama-cpp`'s tables: speeds per column, and ratios per prompt (bench/vs_llama.py measures)."""

from __future__ import annotations

from rich.table import Table


def speed_table(result: dict, report: dict) -> Table:
    table = Table(
        title=f"{result['pair']}: tok/s, -n {report['max_tokens']}, -t {report['threads']}, "
        f"median of {report['repeats']}",
        title_justify="left",
    )
    table.add_column("prompt")
    table.add_column("temp", justify="right")
    labels = list(result["cells"][0]["tokens_per_second"]) if result["cells"] else []
    for label in labels:
        table.add_column(label, justify="right")
    for cell in result["cells"]:
        table.add_row(
            cell["prompt"], f"{cell['temperature']:g}", *(f"{cell['tokens_per_second'][label]:.2f}" for label in labels)
        )
    return table


def ratio_table(result: dict) -> Table:
    table = Table(title="specgguf / llama.cpp (ratio of the medians above)", title_justify="left")
    table.add_column("prompt")
    table.add_column("kind")
    table.add_column("temp", justify="right")
    names = list(result["cells"][0]["ratios"]) if result["cells"] else []
    for name in names:
        table.add_column(name, justify="right")
    for cell in result["cells"]:
        ratios = cell["ratios"]
        table.add_row(
            cell["prompt"],
            cell["kind"],
            f"{cell['temperature']:g}",
            *(
                f"{ratios[name]:.2f}×" + (f" (K={cell['llama_cpp_best_k']})" if "best K" in name else "")
                for name in names
            ),
        )
    return table
