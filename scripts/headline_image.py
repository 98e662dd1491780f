"""The text-to-image headline: ``docs/results/image.json`` (``load_tests/bench_image.py``)."""

from __future__ import annotations

from headline_format import cell, provenance, verdict

SETTINGS = {
    "forced": "every other step (the pipeline's; threshold out of the way)",
    "trained_threshold": "a trained checkpoint's threshold",
}


def render_image(summary: dict) -> list[str]:
    figures, sides = summary["figures"], summary["sides"]
    served = sides["served"]
    lines = [
        f"### Text to image ({served['model']}): the served graph against diffusers on the "
        "same cores",
        "",
        f"{served['size']}x{served['size']}, {served['steps']} steps, served on "
        f"`{served['pipeline']}`, {served['requests_per_level']} requests per level. "
        f"{provenance(summary)}",
        "",
        "![image_concurrency](img/image_concurrency.png)",
        "",
        "| side | processes x threads | images per s | p50 latency (s) | errors |",
        "|---|---|---|---|---|",
    ]
    for name, row in figures["baselines"].items():
        shape = sides["baselines"][name]
        lines.append(
            f"| diffusers `QwenImagePipeline` | {shape['processes']} x {shape['threads']} "
            f"| {cell(row['images_per_s'], 3)} | {cell(row['latency_p50_s'])} | - |"
        )
    for label, key in (
        ("served", "served"),
        ("served, no step cache", "served_without_step_cache"),
    ):
        for level, row in figures[key].items():
            lines.append(
                f"| {label}, c={level[1:]} | graph on {served['cores']} cores "
                f"| {cell(row['images_per_s'], 3)} | {cell(row['latency_p50_s'])} "
                f"| {cell(row['errors'], 0)} |"
            )
    steps = served["steps"]
    lines += [
        "",
        "Step cache, denoising only (4 prompts, the same DiT uncached as reference):",
        "",
        f"| setting | speedup | cached steps of {steps} | worst PSNR (dB) |",
        "|---|---|---|---|",
    ]
    cache = figures["step_cache"]
    for key, row in cache.items():
        name = SETTINGS.get(key, key)
        if key == "trained_threshold":
            name += f" ({sides['trained_threshold']:g})"
        lines.append(
            f"| {name} | {cell(row['speedup'])}x | {cell(row['cached_steps'], 1)} "
            f"| {cell(row['psnr_min_db'], 1)} |"
        )
    ratios = figures["ratios"]
    top = next(k for k in ratios if k.endswith("_over_best_baseline"))
    ends = [
        f"c={k.rsplit('_c', 1)[1]} {cell(v)}x"
        for k, v in ratios.items()
        if k.startswith("served_step_cache_speedup")
    ]
    forced = cache["forced"]
    lines += [
        "",
        f"- Served at c={top.split('_')[1][1:]} against the best same-core diffusers shape: "
        f"{cell(ratios[top])}x.",
        f"- The step cache end to end, served: {', '.join(ends)} (denoising only: "
        f"{cell(forced['speedup'])}x).",
        f"- Step cache >= 1.8x: {verdict(forced['speedup']['median'], 1.8, below=False)}; "
        f"PSNR >= 35 dB: {verdict(forced['psnr_min_db']['median'], 35, below=False)}.",
    ]
    return lines
