"""Pretrained weights through the SDK (materialize(model, checkpoint=...)):
Hugging Face models built on the meta device, filled by the server from
what save_pretrained wrote, compared with from_pretrained value for value
and output for output; a new classification head initialized by the
model's own init; a bfloat16 checkpoint cast to float32."""

import pytest
import torch

import materializer as mz
import serverproc
from materializer import hf

transformers = pytest.importorskip("transformers")
tf = transformers


def gpt2():
    return tf.GPT2LMHeadModel, tf.GPT2Config(n_embd=64, n_layer=2, n_head=2,
                                             vocab_size=256, n_positions=64)


def llama():
    return tf.LlamaForCausalLM, tf.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
        max_position_embeddings=64)


def bert_config():
    return tf.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128, vocab_size=256,
                         max_position_embeddings=64, num_labels=3)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    base = tmp_path_factory.mktemp("sdk-ckpt") / "models"
    base.mkdir()
    torch.manual_seed(3)
    for name, make in (("gpt2", gpt2), ("llama", llama)):
        cls, config = make()
        model = cls(config)
        model.save_pretrained(base / name)
        model.save_pretrained(base / f"{name}-sharded", max_shard_size="100KB")
        # The torch zip format (transformers 5 writes safetensors whatever
        # safe_serialization says): as transformers 4 wrote pytorch_model.bin.
        (base / f"{name}-bin").mkdir()
        model.config.save_pretrained(base / f"{name}-bin")
        torch.save(model.state_dict(), base / f"{name}-bin" / "pytorch_model.bin")
        model.to(torch.bfloat16).save_pretrained(base / f"{name}-bf16")
    # A masked-LM checkpoint; the classifier model adds a new head.
    tf.BertForMaskedLM(bert_config()).save_pretrained(base / "bert")
    return base


@pytest.fixture(scope="module")
def server(root):
    with serverproc.running_server(extra_args=(f"--checkpoint_roots=models={root}",)) as srv:
        yield srv


def assert_same_state(got, want):
    got_sd, want_sd = got.state_dict(), want.state_dict()
    assert set(got_sd) == set(want_sd)
    for name, t in want_sd.items():
        assert got_sd[name].dtype == t.dtype, name
        assert torch.equal(got_sd[name].view(torch.uint8) if t.dtype != torch.bool else got_sd[name],
                           t.view(torch.uint8) if t.dtype != torch.bool else t), name


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
@pytest.mark.parametrize("layout", ["", "-sharded", "-bin"])
@pytest.mark.parametrize("transport", ["stream", "shm"])
def test_weights_and_outputs_equal_from_pretrained(server, root, make, layout, transport):
    cls, _ = make()
    folder = root / (make.__name__ + layout)
    want = cls.from_pretrained(folder).eval()
    model = hf.from_config(tf.AutoConfig.from_pretrained(folder), cls)
    r = mz.materialize(model, server=server.address, checkpoint=f"models/{folder.name}",
                       transport=transport)
    # Non-persistent buffers are not in a checkpoint: their inits make them.
    transient = {n for n, _ in model.named_buffers()} - set(model.state_dict())
    assert r.checkpoint.tensors_initialized == len(transient)
    # torch.save keeps a tied lm_head.weight as a key of its own.
    tied = {"lm_head.weight"} if layout == "-bin" and make is gpt2 else set()
    assert set(r.checkpoint.unused_keys) == tied
    assert_same_state(model, want)
    for name in transient:
        assert torch.equal(model.get_buffer(name), want.get_buffer(name)), name
    ids = torch.tensor([[1, 5, 9, 200, 3]])
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, want(ids).logits)


def test_bfloat16_checkpoint_into_a_float32_model(server, root):
    cls, _ = gpt2()
    folder = root / "gpt2-bf16"
    want = cls.from_pretrained(folder, torch_dtype=torch.bfloat16)
    model = hf.from_config(tf.AutoConfig.from_pretrained(folder), cls)
    model = model.float()
    mz.materialize(model, server=server.address, checkpoint="models/gpt2-bf16")
    for name, t in want.state_dict().items():
        got = model.state_dict()[name]
        assert got.dtype == torch.float32
        assert torch.equal(got, t.to(torch.float32)), name


def test_a_new_head_takes_the_models_init(server, root):
    """BertForSequenceClassification from a masked-LM checkpoint: the
    encoder from the file, bit for bit; the pooler and the classifier (not
    in the file) drawn as the model's _init_weights draws them; the LM
    head's keys reported unused."""
    from safetensors import safe_open
    folder = root / "bert"
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        in_file = set(f.keys())
    config = bert_config()
    want = tf.BertForSequenceClassification.from_pretrained(folder, num_labels=3).eval()
    model = hf.from_config(config, tf.BertForSequenceClassification)
    r = mz.materialize(model, server=server.address, checkpoint="models/bert", seed=11)
    got_sd, want_sd = model.state_dict(), want.state_dict()
    new = sorted(set(got_sd) - in_file)
    assert new == ["bert.pooler.dense.bias", "bert.pooler.dense.weight",
                   "classifier.bias", "classifier.weight"]
    for name, t in want_sd.items():
        if name not in new:
            assert torch.equal(got_sd[name], t), name
    transient = {n for n, _ in model.named_buffers()} - set(got_sd)
    assert r.checkpoint.tensors_initialized == len(new) + len(transient)
    assert any(k.startswith("cls.predictions") for k in r.checkpoint.unused_keys)
    for name in new:  # the model's _init_weights: normal(0, 0.02) and zeros
        t = got_sd[name]
        if name.endswith(".bias"):
            assert torch.all(t == 0), name
        else:
            assert abs(t.std().item() - config.initializer_range) < 0.25 * config.initializer_range
    ids = torch.tensor([[1, 5, 9, 200, 3]])
    with torch.no_grad():
        assert torch.equal(model.eval().bert(ids).last_hidden_state,
                           want.bert(ids).last_hidden_state)


def test_bad_checkpoint_arguments_fail_before_any_call():
    with pytest.raises(ValueError, match="dtype_policy"):
        mz.Checkpoint("models/x", dtype_policy="round")
    with pytest.raises(TypeError, match="checkpoint must be"):
        mz.materialize(torch.nn.Linear(2, 2, device="meta"), server="127.0.0.1:1",
                       checkpoint=42)


def test_hf_from_pretrained_builds_from_the_servers_config(server, root):
    """hf.from_pretrained reads config.json through the server (the trainer
    has no copy) and loads the folder: as transformers' from_pretrained."""
    model, r = hf.from_pretrained("models/llama-sharded", server=server.address)
    want = tf.LlamaForCausalLM.from_pretrained(root / "llama-sharded").eval()
    assert type(model) is tf.LlamaForCausalLM
    assert r.checkpoint.unused_keys == []
    assert_same_state(model, want)
    # A class of one's own, and config attributes set before building.
    clf, r = hf.from_pretrained("models/bert", server=server.address,
                                model_class=tf.BertForSequenceClassification,
                                config_overrides={"num_labels": 3})
    assert clf.classifier.weight.shape == (3, 64)
    assert r.checkpoint.tensors_initialized >= 4  # pooler, classifier
    with pytest.raises(FileNotFoundError, match="no config.json"):
        hf.from_pretrained("models/llama-sharded/model.safetensors.index.json",
                           server=server.address)
