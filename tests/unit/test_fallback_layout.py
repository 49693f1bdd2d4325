"""A fallback that changes the layout is planned and said (issue 24): Llama-3.1-405B on
8-GPU H100 nodes, 8 sequences of 131,072 tokens per replica. fp8 holds 11.8 on two nodes
(TP 8 x PP 2); auto's twice larger KV cache holds 5.9 there and needs a third stage (14.8).
With parallelism.pipeline left out kvq plans each rung's stages; a declared layout is kept
and the fallback says why it no longer fits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from kvq.cli import app
from kvq.decide import Plan, decide
from tests.unit.test_decide import (
    HEAD80_CRASH,
    LLAMA_405B,
    conditions,
    crashing_pod,
    group_of,
    h100_nodes,
    isvc,
    message,
    snapshot,
    with_status,
)

DERIVED = {"tensor": 8}
DECLARED = {"tensor": 8, "pipeline": 2}
NOW_THREE = "A replica now spans 3 nodes (TP 8 x PP 3), was 2 nodes (TP 8 x PP 2)."


def service(parallelism: dict[str, int]) -> dict[str, Any]:
    return isvc(
        model=LLAMA_405B,
        placement={"parallelism": parallelism, "pools": ["gpu-h100"]},
        memory={"maxModelLen": 131072},
        capacity={"minConcurrentSequences": 8},
    )


def refused(plan: Plan) -> dict[str, Any]:
    """The group's leader crash-looping on the fp8 refusal."""
    pod = crashing_pod(plan, HEAD80_CRASH)
    leader = group_of(plan)["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    pod["metadata"]["annotations"] = leader["metadata"]["annotations"]
    return pod


@pytest.mark.parametrize(
    ("parallelism", "nodes", "placed", "stalled", "size", "says"),
    [
        # Derived, room for three nodes: the auto group is planned and applied on three.
        (DERIVED, 3, ("True", "PoolChosen"), "False", 3, NOW_THREE),
        # Derived, two nodes only: auto's group does not fit now; nothing is applied, what
        # runs stays, and the service waits for a third node, saying so.
        (DERIVED, 2, ("False", "WaitingForCapacity"), "False", None, "3 nodes of 8 per replica"),
        # Declared: kvq keeps TP 8 x PP 2, where auto holds too little, and says why.
        (DECLARED, 3, ("False", "NoPoolFits"), "True", None, "kvq keeps a declared layout"),
    ],
)
def test_a_fallback_to_a_larger_kv_cache_plans_its_layout_and_says_it(
    parallelism: dict[str, int],
    nodes: int,
    placed: tuple[str, str],
    stalled: str,
    size: int | None,
    says: str,
) -> None:
    body = service(parallelism)
    first = decide(snapshot(body, node_list=h100_nodes(nodes)))
    assert first.status["capacity"]["layout"]["pipeline"] == 2  # fp8: two nodes
    assert group_of(first)["spec"]["leaderWorkerTemplate"]["size"] == 2
    second = decide(
        snapshot(with_status(body, first), node_list=h100_nodes(nodes), pods=[refused(first)])
    )
    assert conditions(second)["Placed"] == placed
    assert conditions(second)["Stalled"][0] == stalled
    said = " ".join([message(second, "Placed"), *(e.message for e in second.events)])
    assert says in said
    groups = [o for o in second.apply if o["kind"] == "LeaderWorkerSet"]
    if size is None:
        assert groups == []  # nothing applied: what runs is kept
        return
    assert groups[0]["spec"]["leaderWorkerTemplate"]["size"] == size
    assert second.status["capacity"]["layout"] == {
        "tensor": 8,
        "pipeline": 3,
        "nodesPerReplica": 3,
        "layersPerStage": [42, 42, 42],
        "boundingStage": 1,
    }
    # The condition and the Event both name the new layout and the old.
    assert NOW_THREE in message(second, "FallbackActive")
    assert [e.reason for e in second.events] == ["FallbackRuntime"]
    leader = groups[0]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    command = leader["containers"][0]["command"]
    assert command[command.index("--pipeline-parallel-size") + 1] == "3"


def test_a_derived_layout_takes_the_fewest_stages_that_hold_the_capacity() -> None:
    """fp8 at 8 sequences: two nodes (one would not hold the 810 GB of weights)."""
    plan = decide(snapshot(service(DERIVED), node_list=h100_nodes(3)))
    assert plan.status["capacity"]["layout"]["nodesPerReplica"] == 2
    assert plan.status["capacity"]["maxConcurrentSequences"] >= 8


EXAMPLE = Path(__file__).resolve().parents[2] / "examples/llama-3.1-405b-h100.yaml"


@pytest.mark.parametrize(
    ("sequences", "fp8", "auto"),
    [
        # The example: fp8 holds 8 on two nodes, auto needs a third.
        (8, (8, 2), (8, 3)),
        # 12 is more than fp8's 11.8 on two nodes: three for fp8 too.
        (12, (8, 3), (8, 3)),
        # No capacity asked: the fewest stages that hold the weights (one node does not).
        (None, (8, 2), (8, 2)),
    ],
)
def test_kvq_plan_shows_the_layout_the_operator_derives(
    sequences: int | None, fp8: tuple[int, int], auto: tuple[int, int], tmp_path: Path
) -> None:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"] |= {"namespace": "team-a", "uid": "uid-1", "generation": 1}
    if sequences is None:
        del body["spec"]["capacity"]
    else:
        body["spec"]["capacity"]["minConcurrentSequences"] = sequences
    file = tmp_path / "isvc.yaml"
    file.write_text(yaml.safe_dump(body))

    # The operator: the requested rung, then the auto rung after the engine refuses fp8.
    first = decide(snapshot(body, node_list=h100_nodes(3)))
    second = decide(
        snapshot(with_status(body, first), node_list=h100_nodes(3), pods=[refused(first)])
    )
    ran = [
        (p.status["capacity"]["layout"]["tensor"], p.status["capacity"]["layout"]["pipeline"])
        for p in (first, second)
    ]
    assert ran == [fp8, auto]

    preview = CliRunner().invoke(app, ["plan", "-f", str(file), "--gpu", "H100", "-o", "json"])
    assert preview.exit_code == 0, preview.output
    document = json.loads(preview.output)
    derived = document["layout"]["derived"]
    shown = [
        (derived[d]["tensorParallel"], derived[d]["pipelineParallel"]) for d in ("fp8", "auto")
    ]
    assert shown == ran
    # The table is on the layout the operator starts with (the file's fp8).
    assert (document["layout"]["tensorParallel"], document["layout"]["pipelineParallel"]) == fp8
    assert document["dtypes"]["fp8"]["fits"]

    table = CliRunner().invoke(app, ["plan", "-f", str(file), "--gpu", "H100"]).output
    assert f"fp8: {fp8[1]} nodes (TP 8 x PP {fp8[1]})" in table
    assert f"auto: {auto[1]} nodes (TP 8 x PP {auto[1]})" in table
    assert "what a fallback to auto runs" in table


def test_kvq_plan_refuses_a_tensor_size_no_pipeline_places_and_keeps_an_option_given() -> None:
    small = ["plan", "-f", str(EXAMPLE), "--gpu", "H100", "--gpus-per-node", "4"]
    refused = CliRunner().invoke(app, small)
    assert refused.exit_code == 2
    assert "tensor parallel size 8 exceeds the 4 GPUs of one node" in refused.output
    # --parallelism given: that layout, nothing derived.
    given = ["plan", "-f", str(EXAMPLE), "--gpu", "H100", "--parallelism", "8x3", "-o", "json"]
    layout = json.loads(CliRunner().invoke(app, given).output)["layout"]
    assert (layout["pipelineParallel"], "derived" in layout) == (3, False)
