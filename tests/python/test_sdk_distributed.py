"""Shards for distributed training: every rank (gloo on CPU, separate
processes) materializes only its local shards of a model whose parameters
are DTensors on the meta device, and its bytes equal the same slices of
the full model materialized by one process (portable mode)."""

import os
import socket
import subprocess
import sys

import pytest
import torch

import materializer as mz
import serverproc
from sdk_rank import Derived, Net

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world, mode, address, tmp_path, transport_env=None, checkpoint=None):
    port = str(free_port())
    outs = [tmp_path / f"rank{r}.pt" for r in range(world)]
    extra = [checkpoint] if checkpoint else []
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "sdk_rank.py"), str(r),
                               str(world), port, address, mode, str(outs[r]), *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log
    return [torch.load(o) for o in outs]


def assert_slices(ranks, state, replicated):
    """Each rank's local tensor equals its box of the full tensor in
    `state`; the boxes cover every element once, or once per rank for the
    names `replicated` accepts."""
    for name, want in state.items():
        covered = torch.zeros(want.shape, dtype=torch.int32)
        for r, saved in enumerate(ranks):
            box, local, _ = saved[name]
            index = tuple(slice(o, o + n) for o, n in box)
            assert torch.equal(local, want[index]), (name, r)
            covered[index] += 1
        assert torch.all(covered == (len(ranks) if replicated(name) else 1)), name


def full_model(address, padding):
    with torch.device("meta"):
        model = Net(padding=padding)
    mz.materialize(model, server=address, seed=77)
    with torch.no_grad():
        out = model(torch.tensor([[1, 3, 5, 10]]))
    return dict(model.named_parameters()), out


@pytest.mark.parametrize("world,mode", [(2, "fsdp"), (4, "shard1")])
def test_each_rank_materializes_its_shards(server, tmp_path, world, mode):
    ranks = run_ranks(world, mode, server.address, tmp_path)
    full, out = full_model(server.address, padding=mode != "shard1")
    if mode == "fsdp":
        for saved in ranks:     # the forward pass through FSDP2 sees these weights
            assert torch.allclose(saved["__output__"], out), (saved["__output__"], out)
    assert {saved["__transport__"] for saved in ranks} == {"shm" if mode == "fsdp" else "stream"}
    if mode != "fsdp":
        assert min(saved["__parts__"] for saved in ranks) >= 4
    for name, want in full.items():
        covered = torch.zeros(want.shape, dtype=torch.int32)
        for r, saved in enumerate(ranks):
            box, local, placements = saved[name]
            index = tuple(slice(o, o + l) for o, l in box)
            assert tuple(local.shape) == tuple(l for _, l in box), (name, r)
            assert torch.equal(local, want.detach()[index]), (name, r, placements)
            covered[index] += 1
        if mode == "shard1" and name.startswith("emb."):
            assert torch.all(covered == world), name          # each rank holds it whole
        else:
            assert torch.all(covered == 1), name               # the shards tile it
    # Uneven: the last ranks' shards are smaller.
    if mode == "fsdp":
        assert [saved["down.weight"][0][0][1] for saved in ranks] == [4, 3]
    else:
        assert [saved["down.weight"][0][1][1] for saved in ranks] == [3, 3, 3, 1]
        assert [saved["down.bias"][0][0][1] for saved in ranks] == [2, 2, 2, 1]
    server.assert_idle()


def test_derived_values_shard_as_slices_of_the_full_tensor(server, tmp_path):
    """Two ranks of a weight-normalized convolution (v split by columns, g
    by rows: each rank's g needs rows of v it does not hold) and a dt bias
    derived from a draw: every rank's bytes are the full model's slices,
    and the full model's g is the norm of its v."""
    ranks = run_ranks(2, "derived", server.address, tmp_path)
    with torch.device("meta"):
        model = Derived()
    mz.materialize(model, server=server.address, seed=77)
    full = dict(model.named_parameters())
    v = full["conv.parametrizations.weight.original1"].detach()
    g = full["conv.parametrizations.weight.original0"].detach()
    assert torch.allclose(g, torch.norm_except_dim(v.double(), 2, 0).float(), rtol=1e-6)
    dt = torch.nn.functional.softplus(full["dt.bias"].detach().double())
    assert dt.min() >= 0.001 * 0.999 and dt.max() <= 0.1 * 1.001
    for name, want in full.items():
        covered = torch.zeros(want.shape, dtype=torch.int32)
        for r, saved in enumerate(ranks):
            box, local, _ = saved[name]
            index = tuple(slice(o, o + l) for o, l in box)
            assert torch.equal(local, want.detach()[index]), (name, r)
            covered[index] += 1
        if "original" in name or name.startswith("dt."):
            assert torch.all(covered == 1), name
    assert [saved["conv.parametrizations.weight.original1"][0][1][1]
            for saved in ranks] == [2, 2]
    server.assert_idle()


@pytest.fixture
def one_rank_group(tmp_path):
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=0, world_size=1,
                            init_method=f"file://{tmp_path / 'store'}")
    try:
        from torch.distributed.device_mesh import init_device_mesh
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_a_partial_placement_is_refused_naming_the_tensor(server, one_rank_group):
    from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor
    with torch.device("meta"):
        model = Net()
    model.up.weight = torch.nn.Parameter(distribute_tensor(model.up.weight, one_rank_group, [Shard(0)]))
    local = torch.empty(model.up.bias.shape, device="meta")
    model.up.bias = torch.nn.Parameter(DTensor.from_local(local, one_rank_group, [Partial()],
                                                          run_check=False))
    with pytest.raises(mz.CaptureError, match=r"up\.bias \(Linear\): placement Partial"):
        mz.materialize(model, server=server.address)
    server.assert_idle()


@pytest.fixture(scope="module")
def checkpoint_server(tmp_path_factory):
    """A server reading a checkpoint of Net, written as safetensors."""
    from safetensors.torch import save_file
    root = tmp_path_factory.mktemp("dist-ckpt") / "models"
    (root / "net").mkdir(parents=True)
    torch.manual_seed(5)
    state = {k: v.detach().contiguous() for k, v in Net().state_dict().items()}
    save_file(state, str(root / "net" / "model.safetensors"))
    with serverproc.running_server(extra_args=(f"--checkpoint_roots=models={root}",)) as srv:
        yield srv, state, (root / "net" / "model.safetensors").stat().st_size


def test_ranks_load_their_slices_of_a_checkpoint_read_once(checkpoint_server, tmp_path):
    """DTensor ranks (Replicate, Shard(0), Shard(1) mixed) each get their
    slices of the checkpoint's tensors; the server reads the file once for
    all ranks of a job, and not at all for the next job."""
    server, state, file_bytes = checkpoint_server
    for world in (2, 4):
        before = server.stats().checkpoint_cache.bytes_read_from_files
        (tmp_path / f"w{world}").mkdir()
        ranks = run_ranks(world, "checkpoint", server.address, tmp_path / f"w{world}",
                          checkpoint="models/net")
        read = server.stats().checkpoint_cache.bytes_read_from_files - before
        assert read == (file_bytes if world == 2 else 0), (world, read)
        assert sum(saved["__read__"] for saved in ranks) == read
        assert_slices(ranks, state, replicated=lambda name: name == "emb.weight")
    server.assert_idle()


def test_ranks_of_a_mixture_of_experts_model_get_their_experts(tmp_path):
    """Mixtral saved by save_pretrained (one tensor per expert and per gate
    and up projection), loaded by 2 and 4 DTensor ranks with the fused
    experts sharded by expert (Shard(0)) and down_proj by columns: each
    rank's slices equal from_pretrained's, and the server reads the
    checkpoint once for the job."""
    transformers = pytest.importorskip("transformers")
    from sdk_rank import mixtral_config
    torch.manual_seed(3)
    model = transformers.MixtralForCausalLM(mixtral_config())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    root = tmp_path / "models"
    model.save_pretrained(root / "mixtral")
    want = transformers.MixtralForCausalLM.from_pretrained(root / "mixtral").state_dict()
    file_bytes = (root / "mixtral" / "model.safetensors").stat().st_size
    with serverproc.running_server(extra_args=(f"--checkpoint_roots=models={root}",)) as srv:
        for world in (2, 4):
            (tmp_path / f"w{world}").mkdir()
            before = srv.stats().checkpoint_cache.bytes_read_from_files
            ranks = run_ranks(world, "moe", srv.address, tmp_path / f"w{world}",
                              checkpoint="models/mixtral")
            read = srv.stats().checkpoint_cache.bytes_read_from_files - before
            assert read == (file_bytes if world == 2 else 0), (world, read)
            assert_slices(ranks, want, replicated=lambda name: not name.endswith(
                ("gate_up_proj", "down_proj")))
        srv.assert_idle()
