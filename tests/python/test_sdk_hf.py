"""Hugging Face models through the SDK: tiny configs built from config
objects (nothing downloaded), on the meta device, materialized by the
server in torch mode, then checked against what the library itself does
on the CPU and against the captured init calls run in this process."""

import math

import pytest
import torch

import materializer as mz
import matutil
import serverproc
from materializer import hf, reference

transformers = pytest.importorskip("transformers")
tf = transformers

# Tensors this large have a sample std within 5% of the asked one with
# overwhelming probability (the std's relative error is ~1/sqrt(2n));
# smaller ones are checked bit for bit against torch's own normal_ with
# that std, below.
STD_CHECK_MIN_ELEMENTS = 2048


def _gpt2():
    c = tf.GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=256, n_positions=64,
                      bos_token_id=0, eos_token_id=0)
    return c, "AutoModelForCausalLM", {"transformer.h.0.attn.c_proj.weight": 0.02 / math.sqrt(4),
                                       "transformer.h.0.mlp.c_fc.weight": 0.02}


def _llama():
    c = tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                       max_position_embeddings=64, pad_token_id=3, rope_theta=500000.0)
    return c, "AutoModelForCausalLM", {"model.layers.0.self_attn.q_proj.weight": 0.02,
                                       "lm_head.weight": 0.02}


def _bert():
    c = tf.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=128, vocab_size=256, max_position_embeddings=64)
    return c, "AutoModelForMaskedLM", {"bert.encoder.layer.0.attention.self.query.weight": 0.02}


def _t5():
    c = tf.T5Config(d_model=64, d_ff=128, d_kv=16, num_layers=2, num_heads=4, vocab_size=256,
                    decoder_start_token_id=0)
    return c, "AutoModelForSeq2SeqLM", {"shared.weight": 1.0,
                                        "encoder.block.0.layer.0.SelfAttention.q.weight": (64 * 16) ** -0.5,
                                        "encoder.block.0.layer.1.DenseReluDense.wo.weight": 128 ** -0.5}


def _vit():
    c = tf.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=128, image_size=32, patch_size=8)
    return c, "AutoModel", {}


def _whisper():
    c = tf.WhisperConfig(d_model=64, encoder_layers=2, decoder_layers=2,
                         encoder_attention_heads=2, decoder_attention_heads=2,
                         encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=256,
                         num_mel_bins=16, max_source_positions=30, max_target_positions=32,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2,
                         decoder_start_token_id=1, suppress_tokens=[], begin_suppress_tokens=[])
    return c, "AutoModelForSpeechSeq2Seq", {"model.decoder.layers.0.fc1.weight": 0.02}


MODELS = {"gpt2": _gpt2, "llama": _llama, "bert": _bert, "t5": _t5, "vit": _vit,
          "whisper": _whisper}


def inputs(name, config):
    ids = torch.randint(4, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    if name in ("gpt2", "llama"):
        return {"input_ids": ids, "labels": ids}
    if name == "bert":
        return {"input_ids": ids}
    if name == "t5":
        return {"input_ids": ids, "labels": ids[:, :6].contiguous()}
    if name == "vit":
        return {"pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))}
    if name == "whisper":
        feats = torch.randn(2, 16, 60, generator=torch.Generator().manual_seed(0))
        return {"input_features": feats, "decoder_input_ids": ids[:, :5].contiguous()}
    raise KeyError(name)


@pytest.fixture(scope="module")
def server():
    with serverproc.running_server() as srv:
        yield srv


@pytest.mark.parametrize("name", sorted(MODELS))
def test_hugging_face_model(server, name):
    config, auto, asked = MODELS[name]()
    model = hf.from_config(config, auto)
    r = mz.materialize(model, server=server.address, seed=1234, rng="torch", transport="stream")
    spec = r.spec
    named = dict(model.named_parameters(remove_duplicate=False))
    named.update(model.named_buffers(remove_duplicate=False))

    # Nothing left on meta, every value finite.
    for n, t in named.items():
        assert t.device.type == "cpu", n
        if t.is_floating_point():
            assert torch.isfinite(t).all(), n
    # state_dict round trip.
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(sd, strict=True)
    for k, v in model.state_dict().items():
        assert torch.equal(v, sd[k]), k

    # Computed buffers equal those of the model built normally on the CPU.
    cpu = getattr(tf, auto).from_config(config)
    for n, b in cpu.named_buffers():
        assert torch.equal(named[n], b), n
    if name == "whisper":
        assert torch.equal(named["model.encoder.embed_positions.weight"],
                           cpu.model.encoder.embed_positions.weight)

    # The captured init asks for what the model's code asks for, and the
    # values follow it: std within 5% for normal-initialized weights.
    for n, std in asked.items():
        (step,) = spec[n].steps
        assert step.scheme.kind == "normal" and step.scheme.params["std"] == pytest.approx(std), n
    for desc in spec.roots:
        first = desc.steps[0]
        if first.scheme.kind == "normal" and desc.numel >= STD_CHECK_MIN_ELEMENTS:
            got = named[desc.name].double().std().item()
            want = first.scheme.params["std"]
            assert abs(got - want) <= 0.05 * want, (desc.name, got, want)
    # Ties are one storage.
    for desc in spec.tensors:
        if desc.tie_to:
            assert named[desc.name].data_ptr() == named[desc.tie_to].data_ptr()

    # Torch mode: each tensor is, bit for bit, what the captured init calls
    # give in this process with the same per-tensor generators.
    for desc in spec.roots:
        want = reference.init_tensor(torch.empty(desc.shape, dtype=desc.dtype),
                                     desc.steps, spec.seed, desc.name)
        assert matutil.same_bits(named[desc.name].detach(), want), desc.name

    # A forward pass is finite; a causal LM's loss at init is about ln(vocab).
    model.eval()
    with torch.no_grad():
        out = model(**inputs(name, config))
    first_out = out[0] if isinstance(out, tuple) else next(iter(out.values()))
    assert torch.isfinite(first_out).all()
    if name in ("gpt2", "llama"):
        assert abs(out.loss.item() - math.log(config.vocab_size)) <= 0.1 * math.log(config.vocab_size)
    server.assert_idle()


def test_hf_padding_row_of_a_tied_embedding_survives(server):
    """Hugging Face initializes before it ties: the zeroed padding row of
    the embedding is the tied head's row too."""
    config, auto, _ = _llama()
    config.tie_word_embeddings = True
    model = hf.from_config(config, auto)
    spec = mz.describe(model, seed=3)
    assert spec["lm_head.weight"].tie_to == "model.embed_tokens.weight"
    assert [s.region for s in spec["model.embed_tokens.weight"].steps] == [None, ((3, 1), (0, 64))]
    mz.materialize(model, server=server.address, spec=spec)
    assert torch.all(model.lm_head.weight[3] == 0)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    server.assert_idle()


def test_describe_twice_sees_the_same_model():
    config, auto, _ = _bert()
    model = hf.from_config(config, auto)
    a = mz.describe(model, seed=1)
    b = mz.describe(model, seed=1)
    assert a.to_proto() == b.to_proto()
    assert not any("_is_hf_initialized" in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("cls", ["LlamaForCausalLM", "GPT2LMHeadModel", "BertForMaskedLM"])
def test_from_config_takes_a_concrete_model_class(cls):
    config = {"LlamaForCausalLM": _llama, "GPT2LMHeadModel": _gpt2,
              "BertForMaskedLM": _bert}[cls]()[0]
    for given in (getattr(tf, cls), cls):
        model = hf.from_config(config, given)
        assert type(model).__name__ == cls
        assert all(t.device.type == "meta" for t in model.state_dict().values())
    by_auto = hf.from_config(config, {"LlamaForCausalLM": "AutoModelForCausalLM",
                                      "GPT2LMHeadModel": "AutoModelForCausalLM",
                                      "BertForMaskedLM": "AutoModelForMaskedLM"}[cls])
    assert mz.describe(model, seed=1).to_proto() == mz.describe(by_auto, seed=1).to_proto()
