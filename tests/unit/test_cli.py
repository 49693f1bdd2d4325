"""The kvq command line as a platform engineer uses it."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from kvq.api.crd import crd_yaml
from kvq.cli import app

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples/llama3-8b-fp8.yaml")
runner = CliRunner()


def test_crd_prints_the_committed_crd() -> None:
    result = runner.invoke(app, ["crd"])
    assert result.exit_code == 0
    assert result.stdout == crd_yaml()


def test_validate_accepts_the_example() -> None:
    result = runner.invoke(app, ["validate", "-f", EXAMPLE])
    assert result.exit_code == 0
    assert "inferenceservice/llama3-8b valid" in result.stdout


def test_validate_reports_each_violation_and_fails(tmp_path: Path) -> None:
    doc = yaml.safe_load(Path(EXAMPLE).read_text())
    doc["spec"]["memory"]["gpuMemoryUtilization"] = 1.2
    doc["spec"]["kvCache"]["dtype"] = "fp4"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    result = runner.invoke(app, ["validate", "-f", str(bad)])
    assert result.exit_code == 1
    assert 'The InferenceService "llama3-8b" is invalid:' in result.stdout
    assert '* spec.kvCache.dtype: Unsupported value: "fp4"' in result.stdout
    assert "* spec.memory.gpuMemoryUtilization: gpuMemoryUtilization is the fraction" in (
        result.stdout
    )


def test_plan_json_reproduces_the_measured_h200_run() -> None:
    result = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "llama-3-8b",
            "--gpu",
            "NVIDIA-H200",
            "--max-model-len",
            "3648",
            "-o",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    auto, fp8 = plan["dtypes"]["auto"], plan["dtypes"]["fp8"]
    # vLLM 0.26.0 on one H200 printed 891,712 and 1,783,440 tokens; 244.44x and 488.88x.
    assert abs(auto["kvTokens"] / 891_712 - 1) < 0.02
    assert abs(fp8["kvTokens"] / 1_783_440 - 1) < 0.02
    assert abs(auto["maxConcurrency"] / 244.44 - 1) < 0.02
    assert abs(fp8["maxConcurrency"] / 488.88 - 1) < 0.02
    assert fp8["kvBytesPerToken"] * 2 == auto["kvBytesPerToken"]
    assert set(plan["dtypes"]) == {"auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8"}


def test_plan_flags_engine_refusals() -> None:
    result = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "llama-3-8b",
            "--gpu",
            "T4",
            "--kv-cache-dtype",
            "fp8",
            "--engine-version",
            "0.26.0",
            "-o",
            "json",
        ],
    )
    fp8 = json.loads(result.stdout)["dtypes"]["fp8"]
    assert fp8["engine"]["ok"] is False
    assert "Turing" in fp8["engine"]["reason"]


def plan_args(*extra: str) -> list[str]:
    return ["plan", "--model", "llama-3-8b", "--gpu", "H100", "--max-model-len", "8192", *extra]


def test_plan_prints_the_cpu_tier_beside_the_gpu_tier() -> None:
    result = runner.invoke(app, plan_args("--swap-space-gib", "16", "-o", "json"))
    assert result.exit_code == 0, result.output
    dtypes = json.loads(result.stdout)["dtypes"]
    # kvq's default engine (0.26) offloads natively; the host copy keeps the GPU's dtype.
    assert dtypes["auto"]["cpuTier"] == {
        "ok": True,
        "mode": "offload",
        "backend": "native",
        "connector": "OffloadingConnector",
        "gibPerGpu": 16.0,
        "bytes": 16 * 2**30,
        "tokens": 131_072,
        "dtype": "auto",
        "engineVersion": "0.26.0",
    }
    assert dtypes["fp8"]["cpuTier"]["tokens"] == 262_144
    table = runner.invoke(app, plan_args("--swap-space-gib", "16", "--kv-cache-dtype", "fp8"))
    assert "CPU tier tokens" in table.stdout and "262,144" in table.stdout
    assert "CPU tier on vLLM 0.26.0: offload native, OffloadingConnector, 16 GiB per GPU" in (
        table.stdout
    )
    without = json.loads(runner.invoke(app, plan_args("-o", "json")).stdout)
    assert "cpuTier" not in without["dtypes"]["auto"]


def test_plan_says_when_the_engine_cannot_keep_the_cpu_tier() -> None:
    result = runner.invoke(
        app, plan_args("--swap-space-gib", "8", "--engine-version", "0.13.0", "-o", "json")
    )
    tier = json.loads(result.stdout)["dtypes"]["auto"]["cpuTier"]
    assert tier["ok"] is False
    assert "native offloading works from vLLM 0.14" in tier["reason"]
    swap = runner.invoke(app, plan_args("--swap-space-gib", "8", "--engine-version", "0.10.2"))
    assert "CPU tier on vLLM 0.10.2: swap" in swap.stdout
    assert "only the V0 engine swaps" in swap.stdout


def test_plan_rejects_unknown_gpu_and_model() -> None:
    unknown_gpu = runner.invoke(app, ["plan", "--model", "llama-3-8b", "--gpu", "Voodoo5"])
    assert unknown_gpu.exit_code == 2
    assert "unknown GPU 'Voodoo5'" in unknown_gpu.output
    unknown_model = runner.invoke(app, ["plan", "--model", "hf://nobody/nothing", "--gpu", "L4"])
    assert unknown_model.exit_code == 2
    assert "unknown model" in unknown_model.output


def test_plan_parallelism_plans_each_stage_and_names_the_bounding_one() -> None:
    args = ["plan", "--model", "deepseek-ai/DeepSeek-V3", "--gpu", "H100", "--parallelism", "8x2"]
    result = runner.invoke(app, [*args, "--kv-cache-dtype", "fp8", "-o", "json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert (document["layout"]["nodes"], document["layout"]["stageLayers"]) == (2, [31, 30])
    fp8 = document["dtypes"]["fp8"]
    # The second stage (30 expert layers and the LM head) has the least room.
    assert fp8["boundingStage"] == 2
    assert fp8["kvTokens"] == 1_604_800
    # fp8 MLA on Hopper: FlashMLA's blocks of 64 tokens, the second stage's count for both.
    first, second = (s["numBlocks"] for s in fp8["stages"])
    assert first > second == 1_604_800 // 64
    table = runner.invoke(app, args).output
    assert "TP 8 x PP 2 = 16 GPUs on 2 node(s) of 8 GPUs" in table
    assert "stage 2 (layers 31-60): weights 40.90 GiB, KV memory 25.33 GiB per GPU (auto)" in table
    assert "stage 2 has room for the fewest KV blocks" in table


def test_plan_reads_an_inference_service_file_and_its_layout() -> None:
    example = str(ROOT / "examples/llama-3.1-405b-two-nodes.yaml")
    table = runner.invoke(app, ["plan", "-f", example, "--gpu", "H100", "--kv-cache-dtype", "all"])
    assert table.exit_code == 0, table.output
    assert "TP 8 x PP 2 = 16 GPUs on 2 node(s) of 8 GPUs" in table.output
    assert "layers per stage: 63, 63; KV heads per GPU: 1" in table.output
    assert "stage 1 (layers 0-62): weights 47.28 GiB, KV memory 23.24 GiB per GPU (auto)" in (
        table.output
    )
    cells = [[c.strip() for c in line.split("│")] for line in table.output.splitlines()]
    tokens = {row[1]: row[4] for row in cells if len(row) > 4}
    assert (tokens["auto"], tokens["fp8"]) == ("773,632", "1,547,280")
    # The file's own dtype when --kv-cache-dtype is not given; options given win.
    only = runner.invoke(app, ["plan", "-f", example, "--gpu", "H100", "-o", "json"])
    assert set(json.loads(only.output)["dtypes"]) == {"fp8"}
    one_node = runner.invoke(
        app, ["plan", "-f", example, "--gpu", "H200", "--parallelism", "8x1", "-o", "json"]
    )
    assert json.loads(one_node.output)["layout"]["nodes"] == 1
    neither = runner.invoke(app, ["plan", "--gpu", "H100"])
    assert neither.exit_code == 2
    assert "give --model or -f FILE" in neither.output


def test_plan_parallelism_refuses_what_vllm_refuses_naming_valid_sizes() -> None:
    heads = runner.invoke(
        app, ["plan", "--model", "google/gemma-3-1b-it", "--gpu", "H100", "--parallelism", "8x1"]
    )
    assert heads.exit_code == 2
    assert "valid: 1, 2, 4" in heads.output
    one_stage = runner.invoke(
        app, ["plan", "--model", "google/gemma-3-1b-it", "--gpu", "H100", "--parallelism", "2x1"]
    )
    assert one_stage.exit_code == 0, one_stage.output
    assert "on 2x H100" in one_stage.output
    bad = runner.invoke(app, ["plan", "--model", "llama-3-8b", "--gpu", "L4", "--parallelism", "8"])
    assert bad.exit_code == 2
    assert "TPxPP" in bad.output


def test_plan_reads_a_config_json(tmp_path: Path) -> None:
    config = ROOT / "tests/fixtures/vllm/cpu-tiny-head80.config.json"
    result = runner.invoke(app, ["plan", "--model", str(config), "--gpu", "L4", "-o", "json"])
    assert result.exit_code == 0, result.output
    # 2 layers x 2 KV heads x head_dim 80 x K and V x 2 bytes
    assert json.loads(result.stdout)["dtypes"]["auto"]["kvBytesPerToken"] == 2 * 2 * 80 * 2 * 2


def test_render_prints_applyable_manifests() -> None:
    result = runner.invoke(app, ["render", "-f", EXAMPLE, "--pool", "H100"])
    assert result.exit_code == 0, result.output
    kinds = [d["kind"] for d in yaml.safe_load_all(result.stdout)]
    assert kinds == ["ConfigMap", "Deployment", "Service", "PodDisruptionBudget"]
    assert "--kv-cache-dtype\n        - fp8" in result.stdout


def test_render_refuses_fp8_on_a_t4_as_the_operator_does() -> None:
    # On a T4 the operator's ladder finds no rung: fp8 has no path on compute capability
    # 7.5, and the AWQ rung holds fewer sequences than spec.capacity asks. It applies
    # nothing, so the preview prints nothing (it used to print an AWQ Deployment).
    refused = runner.invoke(app, ["render", "-f", EXAMPLE, "--pool", "T4"])
    assert refused.exit_code == 2
    assert "compute capability 7.5" in refused.output
    awq = runner.invoke(app, ["render", "-f", EXAMPLE, "--pool", "T4", "--rung", "awq"])
    assert awq.exit_code == 2
    assert "spec.capacity needs 64" in awq.output


def test_render_on_a_t4_prints_the_awq_rung_the_operator_falls_back_to(tmp_path: Path) -> None:
    doc = yaml.safe_load(Path(EXAMPLE).read_text())
    del doc["spec"]["capacity"]
    relaxed = tmp_path / "relaxed.yaml"
    relaxed.write_text(yaml.safe_dump(doc))
    awq = runner.invoke(app, ["render", "-f", str(relaxed), "--pool", "T4"])
    assert awq.exit_code == 0, awq.output
    deployment = next(d for d in yaml.safe_load_all(awq.stdout) if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert args[args.index("--model") + 1] == "casperhansen/llama-3-8b-instruct-awq"
    assert args[args.index("--quantization") + 1] == "awq"
    assert "rung awq" in awq.stderr
