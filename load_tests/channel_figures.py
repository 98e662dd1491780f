"""What ``bench_channel.py`` keeps and judges from its rounds: the headline figures over the
runs (docs/results/channel.json), the cross-node figures, and the one-node targets."""

from __future__ import annotations

from summary import spread


def kept_figures(runs: list[list[dict]]) -> dict:
    """Per size, over the runs: the auto backend's GB/s and added latency next to memcpy, the
    pickled argument and the direct backend; and the issue's targets."""
    by_size = {}
    for i, row in enumerate(runs[0]):
        rows = [run[i] for run in runs]
        by_size[row["size"]] = {
            "auto_gbps": spread([r["auto"]["gbps"] for r in rows]),
            "auto_transfer_gbps": spread([r["auto"]["transfer_gbps"] for r in rows]),
            "auto_added_ms": spread([r["auto"]["added_ms"] for r in rows]),
            "memcpy_gbps": spread([r["memcpy_gbps"] for r in rows]),
            "pickled_gbps": spread([r["pickled"]["gbps"] for r in rows]),
            "direct_gbps": spread([r["direct"]["gbps"] for r in rows]),
        }
    targets = [one_node_targets(run) for run in runs]
    keys = (
        "auto_transfer_over_memcpy_min_at_16MB_plus",
        "auto_over_memcpy_min_at_16MB_plus",
        "auto_over_pickled_min_at_16MB_plus",
        "added_ms_at_4KB",
    )
    return {"by_size": by_size, "targets": {k: spread([t[k] for t in targets]) for k in keys}}


def cross_node_figures(rows: list[dict], backends: list[str]) -> dict:
    """GB/s per backend by size, and each channel backend over pickled arguments."""
    figures: dict = {}
    channels = [b for b in backends if b not in ("pickled", "copy")]
    for backend in [*channels, "pickled"]:
        figures[f"{backend}_gbps_by_size"] = {r["size"]: r[backend]["gbps"] for r in rows}
    for backend in channels:
        figures[f"{backend}_over_pickled_by_size"] = {
            r["size"]: r[backend]["gbps"] / r["pickled"]["gbps"] for r in rows
        }
    return figures


def one_node_targets(rows: list[dict]) -> dict:
    big = [r for r in rows if r["nbytes"] >= 16 << 20]

    def worst(over: str, field: str = "gbps") -> float:
        return min(
            r["auto"][field] / (r[over] if over.startswith("memcpy") else r[over][field])
            for r in big
        )

    return {
        "auto_over_memcpy_min_at_16MB_plus": worst("memcpy_gbps"),
        "auto_transfer_over_memcpy_min_at_16MB_plus": worst("memcpy_gbps", "transfer_gbps"),
        "auto_transfer_over_memcpy_cold_min_at_16MB_plus": worst(
            "memcpy_cold_gbps", "transfer_gbps"
        ),
        "auto_transfer_over_memcpy_cold_by_size": {
            r["size"]: r["auto"]["transfer_gbps"] / r["memcpy_cold_gbps"] for r in big
        },
        "auto_over_pickled_min_at_16MB_plus": worst("pickled"),
        "auto_transfer_over_copy_round_min_at_16MB_plus": worst("copy", "transfer_gbps"),
        "copy_round_transfer_over_memcpy_by_size": {
            r["size"]: r["copy"]["transfer_gbps"] / r["memcpy_gbps"] for r in big
        },
        "added_ms_at_4KB": rows[0]["auto"]["added_ms"],
        "read_ms_beyond_private_read_by_size": {  # what reading a taken payload costs extra
            r["size"]: r["auto_read"]["added_ms"]
            - r["auto"]["added_ms"]
            - (r["copy_read"]["added_ms"] - r["copy"]["added_ms"])
            for r in rows
        },
        "auto_read_over_copy_read_round_by_size": {
            r["size"]: r["auto_read"]["transfer_gbps"] / r["copy_read"]["transfer_gbps"]
            for r in big
        },
        "auto_stream_over_memcpy_by_size": {
            r["size"]: r["auto"]["stream_gbps"] / r["memcpy_gbps"] for r in big
        },
        "auto_stream_over_pickled_stream_by_size": {
            r["size"]: r["auto"]["stream_gbps"] / r["pickled"]["stream_gbps"] for r in big
        },
        "direct_over_memcpy_min_at_16MB_plus": min(
            r["direct"]["gbps"] / r["memcpy_gbps"] for r in big
        ),
        "direct_tcp_gbps_by_size": {r["size"]: r["direct_tcp"]["gbps"] for r in rows},
    }
