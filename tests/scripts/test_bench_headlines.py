"""The headline tables of docs/benchmarks.md are what the kept summaries say, and a target a
run misses reads as missed."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).parents[2]
spec = importlib.util.spec_from_file_location(
    "bench_headlines", ROOT / "scripts/bench_headlines.py"
)
headlines = importlib.util.module_from_spec(spec)
spec.loader.exec_module(headlines)


def fig(value: float) -> dict:
    """One run's figure in a kept summary's shape."""
    return {"median": value, "min": value, "max": value, "values": [value]}


def test_the_docs_headlines_are_what_the_kept_summaries_say():
    doc = headlines.DOC.read_text()
    assert headlines.BEGIN in doc, "docs/benchmarks.md has no generated headline block"
    assert headlines.replace_block(doc, headlines.render()) == doc, (
        "docs/benchmarks.md's headlines are stale: run scripts/bench_headlines.py"
    )


def test_every_kept_summary_names_its_command_commit_and_machine():
    paths = sorted(headlines.SUMMARIES.glob("*.json"))
    assert paths
    paths += sorted(headlines.SUMMARIES.glob("machines/*/*.json"))
    for path in paths:
        summary = json.loads(path.read_text())
        assert summary["command"].startswith("python load_tests/"), path
        machine = summary["machine"]
        assert summary["commit"] and (machine.get("cores", 0) >= 1 or machine.get("gpu")), path
        assert summary["repeats"] >= 1 and summary["figures"], path


def test_a_changed_figure_shows_as_a_stale_headline(tmp_path):
    shutil.copytree(headlines.SUMMARIES, tmp_path, dirs_exist_ok=True)
    path = tmp_path / "speech.json"
    summary = json.loads(path.read_text())
    ratio = summary["figures"]["ratios"]["throughput_c16_over_best_baseline"]
    ratio.update(median=ratio["median"] + 1.0, max=ratio["max"] + 1.0)
    path.write_text(json.dumps(summary))
    doc = headlines.DOC.read_text()
    assert headlines.replace_block(doc, headlines.render(tmp_path)) != doc


def test_a_missed_target_reads_as_not_met(tmp_path):
    summary = json.loads((headlines.SUMMARIES / "speech.json").read_text())
    for key, value in (("throughput_c16_over_best_baseline", 1.5), ("rtf_c4", 1.2)):
        summary["figures"]["ratios"][key] = {"median": value, "min": value, "max": value}
    (tmp_path / "speech.json").write_text(json.dumps(summary))
    text = headlines.render(tmp_path)
    assert "1.50x, **not met** (>= 5)" in text
    assert "1.20, **not met** (<= 1)" in text


def test_the_realtime_table_reads_a_missed_target_as_missed():
    figures = {
        "turn_latency_p50_s_at_1": fig(0.3),
        "turn_latency_max_s_at_1": fig(0.4),
        "underrun_max_s_at_1": fig(0.0),
        "barge_in_stop_max_s_at_1": fig(0.01),
        "barge_in_stages_idle_max_s_at_1": fig(0.35),
        "turn_latency_p50_s_at_4": fig(0.9),
        "turn_latency_max_s_at_4": fig(1.5),
        "underrun_max_s_at_4": fig(0.6),
    }
    summary = {
        "name": "realtime",
        "command": "python load_tests/bench_realtime.py",
        "commit": "abc",
        "repeats": 1,
        "machine": {"cores": 2, "cpu": "x"},
        "figures": figures,
        "sides": {
            "served": {
                "preset": "small-qwen3-omni",
                "silence_duration_ms": 500,
                "max_output_tokens": 24,
            }
        },
    }
    text = "\n".join(headlines.render_realtime(summary))
    assert "| 4 | 0.90 | 1.50 | 0.60 | - | - |" in text
    assert "p50 turn latency at 1 session: met (<= 0.5)" in text
    assert "no underrun at 4 sessions (worst over runs 0.60 s): **not met**" in text
    assert "barge-in stops the answer: met" in text
    assert "barge-in stops every stage: **not met**" in text


def test_the_gpu_stages_table_reads_a_missed_target_as_missed():
    steps = {
        "bfloat16/cuda_graph/b1": fig(7.0),
        "bfloat16/cuda_graph/b64": fig(12.0),
        "float32/cuda_graph/b1": fig(5.0),
        "float32/cuda_graph/b64": fig(13.0),
    }
    figures = {
        "talker_step_ms": steps,
        "end_to_end": {
            "bfloat16/cuda_graph/b1": {
                "wall_s": fig(2.0),
                "audio_s": 8.0,
                "audio_s_per_s": fig(4.0),
            }
        },
        "transformers_e2e_s": {"bfloat16": {**fig(10.0), "audio_s": 7.9}},
    }
    summary = {
        "name": "gpu_stages",
        "command": "python load_tests/bench_gpu_stages.py",
        "commit": "abc",
        "repeats": 1,
        "machine": {"gpu": "H200", "torch": "2.11"},
        "figures": figures,
        "sides": {"model": "small-qwen3-omni"},
    }
    text = "\n".join(headlines.render_gpu_stages(summary))
    assert "| bfloat16/cuda_graph | 7.00 | 12.00 |" in text
    assert "a step at batch 1: 7.0 ms, **not met** (<= 6)" in text
    assert "a step at batch 64: 12.0 ms, met (<= 15)" in text
    assert "same run: 5.0x (against its fastest run, 5.0x), **not met** (>= 10)" in text
    assert "bf16 no slower than fp32 (graphed step): **not met** at batch [1]" in text


def test_the_stage_messages_table_reads_a_slower_handle_call_as_missed():
    row = {"thinker_request_pickle_us": fig(14.0), "handle_call_ms": fig(7.5)}
    summary = {
        "name": "stage_messages",
        "command": "python load_tests/bench_stage_messages.py",
        "commit": "abc",
        "repeats": 1,
        "machine": {"cores": 2, "cpu": "x"},
        "figures": {"dict": row, "typed": row, "typed_over_dict_handle_call": fig(1.2)},
        "sides": {},
    }
    text = "\n".join(headlines.render_stage_messages(summary))
    assert "| thinker_request (us) | 14.00 | 14.00 |" in text
    assert "| handle_call (ms) | 7.50 | 7.50 |" in text
    assert "back to back): 1.200, **not met** (<= 1.05)" in text


def test_the_session_tiers_table_reads_missed_targets_and_budgets_as_missed():
    summary = json.loads((headlines.SUMMARIES / "session_tiers.json").read_text())
    figures = summary["figures"]
    figures["speedup_host_8k"], figures["speedup_disk_8k"] = fig(8.0), fig(2.5)
    figures["budgets_kept"] = False
    text = "\n".join(headlines.render_session_tiers(summary))
    assert "8k from memory: **not met** (>= 10); from disk: **not met** (>= 3)" in text
    assert "budgets **exceeded**" in text
    del figures["speedup_disk_8k"]  # no turn came from disk
    assert "from disk: no hit" in "\n".join(headlines.render_session_tiers(summary))


def test_the_image_table_shows_every_side_and_reads_a_missed_cache_target_as_missed():
    level = {"images_per_s": fig(0.15), "latency_p50_s": fig(6.5), "errors": fig(0)}
    cache = {"speedup": fig(1.9), "cached_steps": fig(14), "psnr_min_db": fig(35.9)}
    summary = {
        "command": "python load_tests/bench_image.py --repeats 1",
        "commit": "abc",
        "repeats": 1,
        "machine": {"cores": 2, "cpu": "x"},
        "sides": {
            "served": {
                "model": "small-qwen-image",
                "pipeline": "configs/pipelines/qwen_image_small.yaml",
                "cores": 2,
                "size": 512,
                "steps": 28,
                "requests_per_level": "max(4, 1 x concurrency)",
            },
            "baselines": {"2x1": {"processes": 2, "threads": 1}},
            "trained_threshold": 0.12,
        },
        "figures": {
            "step_cache": {"forced": cache, "trained_threshold": {**cache, "speedup": fig(1.0)}},
            "baselines": {"2x1": {"images_per_s": fig(0.14), "latency_p50_s": fig(14.0)}},
            "served": {"c1": level, "c16": level},
            "served_without_step_cache": {"c1": {**level, "images_per_s": fig(0.1)}},
            "ratios": {
                "served_c16_over_best_baseline": fig(1.07),
                "served_step_cache_speedup_c1": fig(1.5),
            },
        },
    }
    text = "\n".join(headlines.render_image(summary))
    assert "| diffusers `QwenImagePipeline` | 2 x 1 | 0.140 | 14.00 | - |" in text
    assert "| served, c=16 | graph on 2 cores | 0.150 | 6.50 | 0 |" in text
    assert "| served, no step cache, c=1 | graph on 2 cores | 0.100 |" in text
    assert "| a trained checkpoint's threshold (0.12) | 1.00x | 14.0 | 35.9 |" in text
    assert "Served at c=16 against the best same-core diffusers shape: 1.07x." in text
    assert "served: c=1 1.50x (denoising only: 1.90x)" in text
    assert "Step cache >= 1.8x: met (>= 1.8)" in text
    summary["figures"]["step_cache"]["forced"]["speedup"] = fig(1.2)
    assert "Step cache >= 1.8x: **not met**" in "\n".join(headlines.render_image(summary))


def test_another_machines_summaries_are_its_own_tables_under_its_heading(tmp_path):
    speech = json.loads((headlines.SUMMARIES / "speech.json").read_text())
    (tmp_path / "speech.json").write_text(json.dumps(speech))
    other = {**speech, "machine": {"cores": 2, "cpu": "Other CPU"}, "commit": "beef"}
    ratio = other["figures"]["ratios"]["rtf_c4"] = {"median": 9.5, "min": 9.5, "max": 9.5}
    (tmp_path / "machines" / "other-cpu-2-cores").mkdir(parents=True)
    (tmp_path / "machines" / "other-cpu-2-cores" / "speech.json").write_text(json.dumps(other))
    text = headlines.render(tmp_path)
    head, _, tail = text.partition("## Headlines on another kind of machine: Other CPU, 2 cores")
    assert tail, "no heading for the other machine"
    assert "at `beef` on 2 cores (Other CPU)" in tail and "9.50, **not met**" in tail
    assert "beef" not in head and "9.50" not in head
    assert ratio["median"] == 9.5
