"""The speech and voice headlines: ``bench_speech.py`` (both omni families),
``bench_speech_curves.py`` and ``bench_realtime.py``'s summaries."""

from __future__ import annotations

from headline_format import cell, provenance, verdict


def render_speech(summary: dict) -> list[str]:
    figures, sides = summary["figures"], summary["sides"]
    reply = sides["reply"]
    lines = [
        f"### Speech ({sides['served']['model']}): the served graph against transformers on "
        "the same cores",
        "",
        f"`{sides['served']['model']}`, {reply['text_tokens']} text tokens and "
        f"{reply['talker_frames']} Talker frames ({reply['audio_s']:.1f} s of audio) per reply, "
        f"streamed pcm16. {provenance(summary)}",
        "",
        "| side | processes x threads | TTFP p50 (s) | E2E p50 (s) | RTF mean | audio s per s "
        "| stall per reply (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in figures["baselines"].items():
        shape = sides["baselines"][name]
        lines.append(
            f"| transformers `generate` | {shape['processes']} x {shape['threads']} "
            f"| - | {cell(row['e2e_p50_s'])} | - | {cell(row['audio_s_per_wall_s'])} "
            "| - |"
        )
    served = sides["served"]
    for name, row in figures["served"].items():
        lines.append(
            f"| served, c={name[1:]} | graph on {served['cores']} cores "
            f"| {cell(row['ttfp_p50_s'])} | {cell(row['e2e_p50_s'])} "
            f"| {cell(row['rtf_mean'])} | {cell(row['audio_s_per_wall_s'])} "
            f"| {cell(row['stall_mean_s'])} |"
        )
    ratios = figures["ratios"]
    ttfp = ratios["ttfp_c1_over_fastest_baseline_e2e"]
    throughput = ratios["throughput_c16_over_best_baseline"]
    rtf = ratios["rtf_c4"]
    lines += [
        "",
        f"- TTFP at c=1 over the fastest baseline's E2E: {cell(ttfp)}, "
        f"{verdict(ttfp['median'], 0.1, below=True)}.",
        f"- Throughput at c=16 over the best same-core baseline: {cell(throughput)}x, "
        f"{verdict(throughput['median'], 5, below=False)} (over one thread: "
        f"{cell(ratios['throughput_c16_over_1x1'])}x).",
        f"- RTF p50 at c=4: {cell(rtf)}, {verdict(rtf['median'], 1.0, below=True)}.",
    ]
    return lines


def render_curve(summary: dict) -> list[str]:
    """A sweep's levels, with the stage that is busiest at each (its engine's busy seconds
    per wall second), and the plot next to the summary."""
    name = summary["name"]
    what = "concurrency" if name.startswith("speech_concurrency") else "reply length"
    lines = [
        f"### Speech: cost against {what}",
        "",
        f"Served on `{summary['sides']['served']['pipeline']}`. {provenance(summary)}",
        "",
        f"![{name}]({summary['sides'].get('plot', f'img/{name}.png')})",
        "",
        "| level | audio s per s | TTFP p50 (s) | TTFP p99 (s) | E2E p50 (s) | RTF mean "
        "| stall per reply (s) | errors | busiest stage (busy s per s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for level, row in summary["figures"]["levels"].items():
        busy = row["busy_per_wall_s"]
        top = max(busy, key=lambda stage: busy[stage]["median"]) if busy else None
        busiest = f"{top} {cell(busy[top])}" if top else "-"
        lines.append(
            f"| {level} | {cell(row['audio_s_per_wall_s'])} | {cell(row['ttfp_p50_s'])} "
            f"| {cell(row['ttfp_p99_s'])} | {cell(row['e2e_p50_s'])} | {cell(row['rtf_mean'])} "
            f"| {cell(row['stall_mean_s'])} | {cell(row['errors'], 0)} | {busiest} |"
        )
    return lines


def render_realtime(summary: dict) -> list[str]:
    figures, served = summary["figures"], summary["sides"]["served"]
    counts = sorted({int(k.rsplit("_at_", 1)[1]) for k in figures if "_at_" in k})
    lines = [
        "### Realtime voice sessions (`/v1/realtime`, server VAD, barge-in)",
        "",
        f"`{served['preset']}`, speech streamed at real time, {served['silence_duration_ms']} ms "
        f"silence window, {served['max_output_tokens']} text tokens per answer. "
        f"{provenance(summary)}",
        "",
        "| sessions | turn latency p50 (s) | turn latency max (s) | underrun max (s) "
        "| barge-in stop max (s) | barge-in to stages idle (s) |",
        "|---|---|---|---|---|---|",
    ]
    for n in counts:
        row = [
            figures.get(f"{name}_at_{n}")
            for name in (
                "turn_latency_p50_s",
                "turn_latency_max_s",
                "underrun_max_s",
                "barge_in_stop_max_s",
                "barge_in_stages_idle_max_s",
            )
        ]
        cells = [cell(f, 3 if i >= 3 else 2) for i, f in enumerate(row)]  # barge-in: ms
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Turn latency counts from the end of the speech plus the silence window. "
        "Targets (issue 36):",
        "",
    ]
    latency = figures["turn_latency_p50_s_at_1"]["median"]
    lines.append(f"- p50 turn latency at 1 session: {verdict(latency, 0.5, below=True)}")
    most = counts[-1]
    underrun = figures[f"underrun_max_s_at_{most}"]["max"]
    lines.append(
        f"- no underrun at {most} sessions (worst over runs {underrun:.2f} s): "
        f"{verdict(underrun, 0.0, below=True)}"
    )
    for name, what in (
        ("barge_in_stop_max_s_at_1", "barge-in stops the answer"),
        ("barge_in_stages_idle_max_s_at_1", "barge-in stops every stage"),
    ):
        if name in figures:
            lines.append(f"- {what}: {verdict(figures[name]['median'], 0.2, below=True)}")
    return lines
