"""Under --json, stdout holds the one JSON object and nothing else (progress, "tensorboard
--logdir", "wrote ..." go to stderr), so that `rlflow ... --json | jq` works for every command.
train-wm and train-controller: tests/worldmodel/test_grown_data.py."""

from __future__ import annotations

import json

import pytest
import yaml

from rlflow.cli import main

QUICK = ("--min-time", "0.05", "--no-peer")


@pytest.fixture
def files(tmp_path, mlp_model):
    model = tmp_path / "mlp.onnx"
    model.write_bytes(mlp_model.SerializeToString())
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({"collect": {"episodes_per_shard": 1}}))
    return {"model": str(model), "config": str(config), "tmp": tmp_path}


COMMANDS = {
    "zoo list": ["zoo", "list"],
    "inspect": ["inspect", "{model}"],
    "measure": ["measure", "{model}", "--vs", "{model}", "--runs", "5"],
    "rules list": ["rules", "list", "--portable"],
    "rules candidates": ["rules", "candidates", "{model}"],
    "rules generate": [
        "rules", "generate", "--max-ops", "1", "--ops", "Relu,Neg", "--ranks", "2",
        "--inputs", "1", "-o", "{tmp}/generated.json",
    ],
    "optimize": ["optimize", "{model}", "--method", "greedy", "-o", "{tmp}/o.onnx", *QUICK],
    "search": ["search", "{model}", "--method", "greedy", "-o", "{tmp}/s.onnx", *QUICK],
    "bench": [
        "bench", "--models", "{model}", "--methods", "greedy", "--deploys", "offline",
        "--start", "original", "--budget", "2", "--out", "{tmp}/bench", *QUICK,
    ],
    "collect": [
        "collect", "--model", "squeezenet-1.1", "--episodes", "1", "--out", "{tmp}/data",
        "--config", "{config}", "--quiet",
    ],
    "costs collect": [
        "costs", "collect", "--provider", "cpu", "--models", "{model}", "--steps", "1",
        "--out", "{tmp}/table.json",
    ],
    "costs list": ["costs", "list"],
    "train-ppo": [
        "train-ppo", "--model", "resnet-18", "--max-candidates", "4", "--horizon", "3",
        "--total-steps", "3", "--no-progress", "--out", "{tmp}/ppo",
    ],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_stdout_is_one_json_object(capfd, files, name):
    argv = [word.format(**files) for word in COMMANDS[name]]
    capfd.readouterr()
    code = main([*argv, "--json"])
    out, err = capfd.readouterr()
    assert code == 0, err
    assert len(out.strip().splitlines()) == 1, out
    assert isinstance(json.loads(out), dict)
