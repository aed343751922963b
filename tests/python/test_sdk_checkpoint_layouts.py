"""Checkpoints whose names or layouts differ from the module's: what
transformers' save_pretrained writes for the model types it converts
while loading (154 of the 822 in transformers 5.24.0). It writes the
names its conversions read (LLaVA's `language_model.model.`, Mixtral's
`block_sparse_moe`) and, for mixture-of-experts models, each expert as its
own tensor where the module holds them fused. Loaded by name, those
tensors silently kept their random init: Gemma 3, PaliGemma, LLaVA and
Mistral 3 came back with nothing from the checkpoint, Mixtral and
Qwen3-MoE with random experts. The SDK now follows the renamings (key
rules, from transformers' own conversion table), has the server assemble
what the conversions stack, concatenate and chunk (found by running
transformers' own conversion code on boxes instead of values), and
refuses the rest (a transpose) before anything is held. Every parameter is perturbed before
saving, so no init can match a checkpoint value by chance (a LayerNorm's
ones)."""

import pytest
import torch

import materializer as mz
import serverproc
from materializer import hf

transformers = pytest.importorskip("transformers")
tf = transformers

TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, head_dim=16)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              image_size=32, patch_size=8)


def llava():
    return tf.LlavaForConditionalGeneration, tf.LlavaConfig(
        text_config=tf.LlamaConfig(**TEXT), vision_config=tf.CLIPVisionConfig(**VISION),
        image_token_index=255)


def gemma3():
    return tf.Gemma3ForConditionalGeneration, tf.Gemma3Config(
        text_config=tf.Gemma3TextConfig(**TEXT), vision_config=tf.SiglipVisionConfig(**VISION),
        mm_tokens_per_image=4, image_token_index=255, boi_token_index=254, eoi_token_index=253)


def paligemma():
    return tf.PaliGemmaForConditionalGeneration, tf.PaliGemmaConfig(
        text_config=tf.GemmaConfig(**TEXT), vision_config=tf.SiglipVisionConfig(**VISION),
        image_token_index=255)


def mistral3():
    return tf.Mistral3ForConditionalGeneration, tf.Mistral3Config(
        text_config=tf.MistralConfig(**TEXT),
        vision_config=tf.PixtralVisionConfig(**VISION, head_dim=16), image_token_index=255)


def esm():
    return tf.EsmForMaskedLM, tf.EsmConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=33, pad_token_id=1, mask_token_id=32)


def mixtral():
    return tf.MixtralForCausalLM, tf.MixtralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, vocab_size=256)


def qwen3_moe():
    return tf.Qwen3MoeForCausalLM, tf.Qwen3MoeConfig(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_experts=4, vocab_size=256)


RENAMED = {"llava": llava, "gemma3": gemma3, "paligemma": paligemma, "mistral3": mistral3,
           "esm": esm}
def olmoe():
    return tf.OlmoeForCausalLM, tf.OlmoeConfig(
        hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, vocab_size=256)


CONVERTED = {"mixtral": mixtral, "qwen3_moe": qwen3_moe, "olmoe": olmoe}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    base = tmp_path_factory.mktemp("layouts") / "models"
    base.mkdir()
    torch.manual_seed(5)
    for name, make in {**RENAMED, **CONVERTED}.items():
        cls, config = make()
        model = cls(config)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        model.save_pretrained(base / name)
        if name in CONVERTED:   # the experts spread over several files
            model.save_pretrained(base / f"{name}-sharded", max_shard_size="40KB")
    return base


@pytest.fixture(scope="module")
def server(root):
    with serverproc.running_server(extra_args=(f"--checkpoint_roots=models={root}",)) as srv:
        yield srv


def assert_same_state(got, want):
    got_sd, want_sd = got.state_dict(), want.state_dict()
    assert set(got_sd) == set(want_sd)
    differ = [n for n, t in want_sd.items()
              if got_sd[n].dtype != t.dtype or not torch.equal(got_sd[n], t)]
    assert not differ, f"{len(differ)} tensors differ from from_pretrained's: {differ[:5]}"


@pytest.mark.parametrize("name", sorted(RENAMED))
def test_a_renamed_checkpoint_loads_as_from_pretrained(server, root, name):
    cls, _ = RENAMED[name]()
    want = cls.from_pretrained(root / name)
    model, r = hf.from_pretrained(f"models/{name}", server=server.address)
    assert type(model) is cls
    assert r.checkpoint.unused_keys == []
    assert r.checkpoint.tensors_loaded > 0
    assert_same_state(model, want)
    # materialize(model, checkpoint=...) on a model built by hand does the same.
    cls, config = RENAMED[name]()
    own = hf.from_config(config, cls)
    r = mz.materialize(own, server=server.address, checkpoint=f"models/{name}",
                       transport="stream")
    assert r.checkpoint.unused_keys == []
    assert_same_state(own, want)
    server.assert_idle()


@pytest.mark.parametrize("name", sorted(CONVERTED))
def test_experts_stored_one_by_one_load_as_from_pretrained(server, root, name):
    """Mixture-of-experts weights save_pretrained stores one expert (and one
    of gate and up) per tensor: the server assembles them as transformers'
    conversions do (stacked, concatenated), in one handle and split over
    several, and with key rules of one's own."""
    cls, _ = CONVERTED[name]()
    want = cls.from_pretrained(root / name)
    model, r = hf.from_pretrained(f"models/{name}", server=server.address)
    assert r.checkpoint.unused_keys == []
    assert_same_state(model, want)
    files = sorted(p.name for p in (root / f"{name}-sharded").glob("*.safetensors"))
    assert len(files) >= 3, files
    model, r = hf.from_pretrained(f"models/{name}-sharded", server=server.address)
    assert r.checkpoint.unused_keys == []
    assert_same_state(model, want)
    fused = [n for n in want.state_dict() if n.endswith("mlp.experts.gate_up_proj")]
    assert fused, "the model holds fused experts"
    # Several handles (the stream transport's parts), each with only its
    # own tensors' assemblies; then rules the caller gave.
    cls, config = CONVERTED[name]()
    own = hf.from_config(config, cls)
    r = mz.materialize(own, server=server.address, checkpoint=f"models/{name}",
                       transport="stream", part_bytes=64 << 10)
    assert r.checkpoint.unused_keys == []
    assert_same_state(own, want)
    cls, config = CONVERTED[name]()
    own = hf.from_config(config, cls)
    rules = hf.checkpoint_layout(own, {k: v for k, v in _shapes(root / name).items()})[0]
    mz.materialize(own, server=server.address, transport="stream",
                   checkpoint=mz.Checkpoint(f"models/{name}", key_rules=rules or {"": ""}))
    assert_same_state(own, want)
    server.assert_idle()


def _shapes(folder):
    from safetensors import safe_open
    shapes = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for key in f.keys():
                shapes[key] = list(f.get_slice(key).get_shape())
    return shapes


@pytest.mark.parametrize("cls_name", ["Inkling2TextModel", "Step3p7Model"])
def test_a_reordering_of_one_stored_tensor_is_traced_and_loads_as_from_pretrained(
        server, root, cls_name):
    """Interleave (Inkling 2's experts: gate and up stored interleaved) and
    PermuteForRope after a Chunk (Step 3.7's vision attention: q, k, v in
    one stored tensor, q and k in the rotary layout of the checkpoint) are
    no stacks or cuts: the SDK runs transformers' conversion on the stored
    tensor's element indices and sends the runs it finds as parts."""
    from hf_checkpoint_sweep import small_model
    cls = getattr(tf, cls_name)
    torch.manual_seed(7)
    model = small_model(cls)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(root / cls_name)
    want = cls.from_pretrained(root / cls_name)
    got, r = hf.from_pretrained(f"models/{cls_name}", server=server.address)
    assert r.checkpoint.unused_keys == []
    assert r.checkpoint.tensors_assembled > 0
    assert_same_state(got, want)
    server.assert_idle()


def test_what_cannot_be_traced_is_refused_before_anything_is_held(server, root, monkeypatch):
    """Two stored tensors merged by arithmetic-free but multi-input code
    (Inkling 2 Loop's message queries), and a reordering of a tensor larger
    than the SDK traces: refused naming the tensors and why, before a byte
    is read."""
    from hf_checkpoint_sweep import small_model
    model = small_model(tf.Inkling2LoopTextModel)
    model.save_pretrained(root / "inkling2-loop")
    read_before = server.stats().checkpoint_cache.bytes_read_from_files
    with pytest.raises(mz.CheckpointLayoutError) as e:
        hf.from_pretrained("models/inkling2-loop", server=server.address)
    message = str(e.value)
    assert "message_input.query" in message and "Inkling2LoopMergeMessageQueries" in message
    assert "random init" in message
    if not (root / "Inkling2TextModel").exists():
        small_model(tf.Inkling2TextModel).save_pretrained(root / "Inkling2TextModel")
    monkeypatch.setattr(hf, "_MAX_TRACED_ELEMENTS", 16)
    with pytest.raises(mz.CheckpointLayoutError, match=r"elements, more than the 16 "):
        hf.from_pretrained("models/Inkling2TextModel", server=server.address)
    server.assert_idle()
    assert server.stats().checkpoint_cache.bytes_read_from_files == read_before


def test_a_config_with_special_floats_is_read_as_transformers_reads_it(server, root):
    """save_pretrained stores an infinite float as {"__float__": "Infinity"}
    (GraniteMoeHybrid's time_step_limit): hf.from_pretrained reads the
    server's config.json with transformers' own reader, where it used to
    build the config from the raw JSON and fail validation."""
    from hf_checkpoint_sweep import small_model
    model = small_model(tf.GraniteMoeHybridModel)
    assert model.config.time_step_limit[1] == float("inf")
    model.save_pretrained(root / "granitemoehybrid")
    assert '"__float__": "Infinity"' in (root / "granitemoehybrid" / "config.json").read_text()
    want = tf.GraniteMoeHybridModel.from_pretrained(root / "granitemoehybrid")
    got, r = hf.from_pretrained("models/granitemoehybrid", server=server.address)
    assert got.config.time_step_limit == want.config.time_step_limit
    assert r.checkpoint.unused_keys == []
    assert_same_state(got, want)
    server.assert_idle()


def test_a_server_that_ignores_assemblies_is_caught_and_nothing_is_held(server, monkeypatch):
    """A server older than assemblies ignores the field (an unknown proto3
    field) and would leave the fused experts to their random inits. Played
    here by dropping the assemblies on their way out: the SDK compares the
    number of tensors the server reports assembled with what it sent, and
    refuses, releasing the handle, in one handle and in parts."""
    from materializer.client import client as client_module
    real = client_module.Client.materialize

    def older_server(self, model, placement=None, *, checkpoint=None, **kwargs):
        if checkpoint is not None:
            stripped = type(checkpoint)()
            stripped.CopyFrom(checkpoint)
            del stripped.assemblies[:]
            checkpoint = stripped
        return real(self, model, placement, checkpoint=checkpoint, **kwargs)

    monkeypatch.setattr(client_module.Client, "materialize", older_server)
    for kwargs in ({}, {"transport": "stream", "part_bytes": 64 << 10}):
        cls, config = CONVERTED["mixtral"]()
        with pytest.raises(mz.CheckpointLayoutError, match=r"assembled 0 of the \d+ tensors"):
            mz.materialize(hf.from_config(config, cls), server=server.address,
                           checkpoint="models/mixtral", **kwargs)
        server.assert_idle()
