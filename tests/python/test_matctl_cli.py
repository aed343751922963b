"""matctl's contract through the real binary: an exit code per outcome,
per-command --help, a hint when no server answers, one number encoding in
every --output=json, doctor on a CPU-only server, and `./dev matctl`
printing nothing but matctl's own output. (Exit code 4, a refused
identity, is exercised with real credentials in test_matctl_identity.py.)"""

import json
import os
import subprocess

import pytest

import serverproc
from test_matctl_identity import matctl

CLIENT = "matctl-cli-test"
EXIT = {"ok": 0, "failure": 1, "usage": 2, "not_found": 3,
        "exhausted": 5, "unavailable": 6, "data_loss": 7}


def write_model(tmp_path, name="tiny.json", shape=(64, 32)):
    path = tmp_path / name
    path.write_text(json.dumps({"exportable": True, "model": {
        "tensors": [{"name": "fc.weight", "shape": list(shape),
                     "dtype": "float32"},
                    {"name": "fc.bias", "shape": [shape[0]],
                     "dtype": "float32"}],
        "initRules": [{"pattern": "*.bias", "init": {"zeros": {}}},
                      {"pattern": "*", "init": {"uniform": {}}}],
        "seed": "7"}}))
    return str(path)


def on(server, *args, **kw):
    return matctl(f"--server={server.address}", f"--client={CLIENT}", *args,
                  **kw)


@pytest.fixture
def handle(server, tmp_path):
    made = on(server, "--output=json", "materialize", write_model(tmp_path))
    assert made.returncode == 0, made.stderr
    h = json.loads(made.stdout)["handle"]
    yield h
    # --force: a test that failed half way may have left an export open.
    on(server, "release", "--force", h)
    assert server.client_usage(CLIENT) == (0, 0)


def test_exit_codes_tell_outcomes_apart(server, handle, tmp_path):
    def code(*args):
        return on(server, *args).returncode

    assert code("describe", handle) == EXIT["ok"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": {"tensors": [
        {"name": "w", "shape": [-4], "dtype": "float32"}]}}))
    invalid = on(server, "materialize", str(bad))
    assert invalid.returncode == EXIT["failure"], invalid.stderr
    assert "INVALID_ARGUMENT" in invalid.stderr and "shape" in invalid.stderr

    assert code("describe") == EXIT["usage"]
    assert code("ls", "--all") == EXIT["usage"]
    assert code("frobnicate") == EXIT["usage"]

    missing = on(server, "describe", "h-00000000000000000000000000000000")
    assert missing.returncode == EXIT["not_found"], missing.stderr
    assert "NOT_FOUND" in missing.stderr

    huge = write_model(tmp_path, "huge.json", shape=(1 << 16, 1 << 16))
    exhausted = on(server, "materialize", huge)
    assert exhausted.returncode == EXIT["exhausted"], exhausted.stderr
    assert "RESOURCE_EXHAUSTED" in exhausted.stderr

    unreachable = matctl("--server=127.0.0.1:1", "--timeout=10s", "ls")
    assert unreachable.returncode == EXIT["unavailable"], unreachable.stderr
    assert ("hint: no server answered at 127.0.0.1:1. Is materializerd "
            "running there?") in unreachable.stderr

    # A .partial file whose bytes differ from the handle's file: the resumed
    # fetch fails its digest check, and the bad partial file is removed.
    whole = tmp_path / "whole.safetensors"
    assert code("fetch", handle, "-o", str(whole)) == EXIT["ok"]
    out = tmp_path / "resumed.safetensors"
    partial = tmp_path / "resumed.safetensors.partial"
    corrupted = bytearray(whole.read_bytes()[:4096])
    corrupted[-1] ^= 0xFF
    partial.write_bytes(bytes(corrupted))
    lost = on(server, "fetch", handle, "-o", str(out), "--resume")
    assert lost.returncode == EXIT["data_loss"], lost.stderr
    assert "DATA_LOSS" in lost.stderr
    assert not partial.exists() and not out.exists()


def test_every_command_has_its_own_help():
    listed = matctl("--help")
    assert listed.returncode == 0 and listed.stderr == ""
    commands = [line.split()[0] for line in
                listed.stdout.split("commands:\n")[1].split("\n\n")[0]
                .splitlines() if line.startswith("  ") and
                not line.startswith("   ")]
    assert {"plan", "materialize", "fetch", "doctor", "replicas", "ls"} <= \
        set(commands), commands
    for command in commands:
        r = matctl(command, "--help")
        assert r.returncode == 0, (command, r.stderr)
        assert r.stdout.startswith(f"usage: matctl [FLAGS] {command}"), r.stdout
        assert matctl("help", command).stdout == r.stdout
    fetch = matctl("fetch", "--help").stdout
    assert "--resume" in fetch and "--importer_device_uuid" not in fetch


def test_the_server_can_come_from_the_environment(server):
    r = matctl("health", env={"MATERIALIZER_SERVER": server.address})
    assert r.returncode == 0, r.stderr
    assert r.stdout == "SERVING\n"


def number_types(pb):
    """JSON name -> {"64", "32"} over every integer field of the API."""
    from google.protobuf.descriptor import FieldDescriptor as F
    wide = {F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_SINT64, F.TYPE_FIXED64,
            F.TYPE_SFIXED64}
    narrow = {F.TYPE_INT32, F.TYPE_UINT32, F.TYPE_SINT32, F.TYPE_FIXED32,
              F.TYPE_SFIXED32}
    kinds = {}
    for message in pb.DESCRIPTOR.message_types_by_name.values():
        stack = [message]
        while stack:
            m = stack.pop()
            stack.extend(m.nested_types)
            for field in m.fields:
                if field.type in wide:
                    kinds.setdefault(field.json_name, set()).add("64")
                elif field.type in narrow:
                    kinds.setdefault(field.json_name, set()).add("32")
    return kinds


def check_numbers(value, kinds, where, seen):
    """Every 64-bit integer is a string of digits, every 32-bit one a
    number, wherever it appears."""
    if isinstance(value, dict):
        for key, item in value.items():
            kind = kinds.get(key, set())
            if kind == {"64"} and not isinstance(item, (dict, list)):
                assert isinstance(item, str) and item.lstrip("-").isdigit(), \
                    f"{where}.{key} = {item!r}: 64-bit integers are strings"
                seen.add("64")
            elif kind == {"32"} and not isinstance(item, (dict, list)):
                assert isinstance(item, int) and not isinstance(item, bool), \
                    f"{where}.{key} = {item!r}: 32-bit integers are numbers"
                seen.add("32")
            check_numbers(item, kinds, f"{where}.{key}", seen)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_numbers(item, kinds, f"{where}[{i}]", seen)


def test_every_json_output_encodes_numbers_the_same_way(server, handle,
                                                        tmp_path):
    pb, _ = serverproc.import_protos()
    kinds = number_types(pb)
    model = write_model(tmp_path, "plan.json")
    out = tmp_path / "w.safetensors"
    runs = {
        "plan": on(server, "--output=json", "plan", model),
        "describe": on(server, "--output=json", "describe", handle),
        "ls": on(server, "--output=json", "ls"),
        "stats": on(server, "--output=json", "stats"),
        "doctor": on(server, "--output=json", "doctor"),
        "health": on(server, "--output=json", "health"),
        "replicas": on(server, "--output=json", "replicas"),
        "renew": on(server, "--output=json", "renew", handle),
        "fetch": on(server, "--output=json", "fetch", handle, "-o", str(out)),
        "export": on(server, "--output=json", "export", handle),
    }
    seen = set()
    for name, r in runs.items():
        assert r.returncode == 0, (name, r.stderr)
        check_numbers(json.loads(r.stdout), kinds, name, seen)
    assert seen == {"32", "64"}
    fetched = json.loads(runs["fetch"].stdout)
    assert fetched["totalBytes"] == str(os.path.getsize(out))
    assert fetched["verified"] is True
    export_id = json.loads(runs["export"].stdout)["exportId"]
    closed = on(server, "--output=json", "close-export", export_id)
    assert closed.returncode == 0, closed.stderr
    assert json.loads(closed.stdout) == {"remainingExports": 0}
    released = on(server, "--output=json", "release", handle)
    body = json.loads(released.stdout)
    assert body["released"] is True and isinstance(body["freedBytes"], str)
    assert int(body["freedBytes"]) > 0


def test_doctor_on_a_cpu_server_says_there_is_no_gpu(server):
    r = on(server, "doctor")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"the server at {server.address}\n"
                               "  no GPU on this server; its devices: cpu "
                               "(ledger: 8.00 GiB capacity"), r.stdout
    assert "findings: none" in r.stdout
    body = json.loads(on(server, "--output=json", "doctor").stdout)
    assert body["findings"] == []
    [entry] = body["replicas"]
    assert [d["device"] for d in entry["stats"]["devices"]] == ["cpu"]
    assert "driver" not in entry["stats"]["devices"][0]


def test_dev_matctl_prints_only_matctls_output():
    dev = os.path.join(serverproc.REPO, "dev")
    direct = matctl("--help")
    via_dev = subprocess.run([dev, "matctl", "--help"], capture_output=True,
                             text=True, timeout=600, cwd=serverproc.REPO)
    assert via_dev.returncode == 0, via_dev.stderr
    assert via_dev.stderr == ""
    assert via_dev.stdout == direct.stdout
    usage = subprocess.run([dev, "matctl", "describe"], capture_output=True,
                           text=True, timeout=600, cwd=serverproc.REPO)
    assert usage.returncode == 2
    assert usage.stdout == ""
    assert usage.stderr.startswith("matctl: describe takes 1 argument"), \
        usage.stderr
