"""The table ``bench_gpu_stages.py`` prints from its summary: the Talker step's ms by dtype,
step kind and batch, then Code2wav, Talker + Code2wav end to end, and transformers."""

from __future__ import annotations


def print_table(summary: dict) -> None:
    print(f"\n{summary['device']}, {summary['model']}, torch {summary['torch']}")
    print("Talker step (ms) | dtype | " + " | ".join(f"b{b}" for b in _batches(summary)))
    steps = summary.get("talker_step", []) + summary.get("talker_step_compiled", [])
    for (dtype, step), rows in _group(steps).items():
        by_batch = {r["batch"]: f"{r['ms']:.1f}" if "ms" in r else "err" for r in rows}
        cells = [by_batch.get(b, "-") for b in _batches(summary)]
        print(f"  {step:<10} | {dtype:<8} | " + " | ".join(cells))
    for row in summary.get("qwen2_5_talker_step", []):
        ms = f"{row['ms']:.1f} ms" if "ms" in row else row.get("error", "")[:80]
        print(f"Qwen2.5 Talker step {row['dtype']} {row['step']} batch {row['batch']}: {ms}")
    for row in summary.get("code2wav", []):
        print(
            f"Code2wav {row['dtype']} batch {row.get('batch', 1)}: "
            f"{row['ms_per_25_frames']} ms per 25-frame chunk of each stream"
        )
    for row in summary.get("end_to_end", []):
        print(
            f"Talker+Code2wav {row['dtype']} {row['step']} batch {row['batch']}: "
            f"{row['wall_s']:.2f} s for {row['audio_s']:.1f} s of audio in all "
            f"({row['audio_s_per_s']:.1f} audio s/s)"
        )
    for row in summary.get("transformers", []):
        print(
            f"transformers generate {row['dtype']}: {row['e2e_s']:.2f} s E2E "
            f"(range {row['e2e_range_s'][0]:.2f}-{row['e2e_range_s'][1]:.2f}) for "
            f"{row['audio_s']:.1f} s audio"
        )


def _batches(summary: dict) -> list[int]:
    return sorted({r["batch"] for r in summary.get("talker_step", [])})


def _group(rows: list[dict]) -> dict:
    out: dict = {}
    for row in rows:
        out.setdefault((row["dtype"], row["step"]), []).append(row)
    return out
