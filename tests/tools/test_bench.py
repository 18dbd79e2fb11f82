"""The benchmark script runs end to end at tiny sizes and reports every target it promises."""

from __future__ import annotations

import json
import math

import pytest
import torch

from attnbook_tools import bench


def test_bench_smoke_run_writes_results_and_table(tmp_path, capsys):
    out = tmp_path / "bench" / "results.json"
    assert bench.main(["--smoke", "--threads", "1", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["smoke"] is True and results["machine"]["threads"] == 1

    # every target appears, for both multi-head configurations and both modes
    names = {key.split("[", 1)[0] for key in results["ratios"]}
    assert names == set(bench.TARGETS)
    assert len(results["multihead"]) == 2 * len(bench.SMOKE.mha_configs)
    assert all(math.isfinite(r) and r > 0 for r in results["ratios"].values())
    for row in results["multihead"]:
        extra = {"fused_attention", "F.sdpa"} if row["mode"] == "forward" else set()
        assert set(row["seconds"]) == {"torch_weights", "math", "torch_no_weights", "sdpa"} | extra
    assert [row["L"] for row in results["tiled"]] == list(bench.SMOKE.tiled_lengths)
    # the plain path holds the L x S fp32 scores at least; the tiled path never does
    big = results["tiled"][-1]
    assert big["peak_bytes"]["plain"] >= big["L"] * big["S"] * 4
    assert big["peak_bytes"]["tiled"] < big["L"] * big["S"] * 4
    assert [row["same_tokens"] for row in results["kv_cache"]] == [True] * len(bench.SMOKE.models)
    # one decoded token: the grouped-query cache is H / H_kv times smaller, and each cached step
    # gives the full sequence's last row
    step = results["decode_step"]
    E, H, H_kv, S = bench.SMOKE.decode_layer
    assert step["cache_bytes"]["mha"] == 2 * S * E * 4 == step["cache_bytes"]["gqa"] * H // H_kv
    assert step["same_as_full"] == {"mha": True, "gqa": True}
    assert set(step["seconds"]) == {"mha", "gqa", "recompute"}
    # latent attention: C + R numbers a token, the absorbed step equal to the plain one
    latent = results["latent"]
    E, H, C, R, Dn, Dv, S = bench.SMOKE.latent_layer
    assert latent["cache_bytes"] == {"latent": (S + 1) * (C + R) * 4, "mha": 2 * H * (Dn + R) * (S + 1) * 4}
    assert latent["absorbed_equals_plain"] and set(latent["seconds"]) == {"plain", "absorbed"}
    # the checks' cost: for each of the three calls, a time and the part of it the checks take
    assert len(results["checks"]) == 3
    assert all(0 < row["seconds"]["checks"] < row["seconds"]["call"] for row in results["checks"])
    assert results["checks"][0]["check_calls"] == ["attention_call"]

    table = capsys.readouterr().out
    assert table.startswith("| measure | configuration | ratio | target | met |")
    for description in (d for _, _, d in bench.TARGETS.values()):
        assert description in table


def test_interleaved_medians_calls_each_in_turn():
    from attnbook_tools.measure import interleaved_medians

    calls = []
    medians = interleaved_medians(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3, warmup=1
    )
    assert calls == ["a", "b"] * 4
    assert set(medians) == {"a", "b"} and all(t >= 0 for t in medians.values())


@pytest.mark.parametrize("repeats, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_interleaved_medians_rejects_bad_repeats(repeats, error, raises_naming):
    from attnbook_tools.measure import interleaved_medians

    with raises_naming(error, "`repeats`", repr(repeats)):
        interleaved_medians({"a": lambda: None}, repeats=repeats)


def test_the_timer_measures_each_function_in_turn_and_tells_slow_from_fast():
    import time

    order = []
    medians = bench.timed_medians({"slow": lambda: (order.append("slow"), time.sleep(0.004)),
                                   "fast": lambda: order.append("fast")}, rounds=3, min_run_time=0.002)
    assert 0.004 <= medians["slow"] < 1 and medians["fast"] < medians["slow"] / 4
    # the slow one runs once per round (after its warm-up call), between the fast one's blocks
    assert order.count("slow") == 4 and order[0] == "slow" and order.index("fast") == 1


def test_the_checks_of_a_call_are_recorded_once_each_and_put_back():
    from attnbook import _checks
    from attnbook.functional import attention

    q = torch.randn(1, 2, 3, 4)
    before = _checks.attention_call
    checks = bench.recorded_checks(lambda: attention(q, q, q))
    assert [f.__name__ for f, _, _ in checks] == ["attention_call"]  # its own inner checks are part of it
    assert _checks.attention_call is before
    with pytest.raises(TypeError, match="`query` must be a tensor"):
        attention([1.0], [1.0], [1.0])
