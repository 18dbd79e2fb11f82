"""The benchmark script runs end to end at tiny sizes and reports every target it promises."""

from __future__ import annotations

import json
import math

import pytest

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

    table = capsys.readouterr().out
    assert table.startswith("| measure | configuration | ratio | target | met |")
    for description in (d for _, _, d in bench.TARGETS.values()):
        assert description in table


def test_interleaved_medians_calls_each_in_turn():
    from attnbook_tools import measure

    assert bench.interleaved_medians is measure.interleaved_medians  # one timing API, in measure
    calls = []
    medians = bench.interleaved_medians(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3, warmup=1
    )
    assert calls == ["a", "b"] * 4
    assert set(medians) == {"a", "b"} and all(t >= 0 for t in medians.values())


@pytest.mark.parametrize("repeats, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_interleaved_medians_rejects_bad_repeats(repeats, error, raises_naming):
    with raises_naming(error, "`repeats`", repr(repeats)):
        bench.interleaved_medians({"a": lambda: None}, repeats=repeats)


def test_bench_rejects_bad_threads(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--smoke", "--threads", "0"])
    assert "--threads" in capsys.readouterr().err
