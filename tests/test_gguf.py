"""GGUF loader (mlx_fp4.checkpoints.gguf) on tiny synthetic files: name mapping, config, the
affine layers mx.load gives, and the error paths (wrong architecture, a tensor type mx.load
cannot read). The files are written here (mx.save_gguf, or by hand for raw ggml types): no
`gguf` package needed."""

import struct

import mlx.core as mx
import mlx.nn as nn
import pytest

pytest.importorskip("mlx_lm")

from mlx_fp4.checkpoints import gguf  # noqa: E402

HIDDEN, FFN, HEADS, KV, VOCAB = 64, 128, 4, 2, 96


def _metadata(arch="llama"):
    u = lambda v: mx.array(v, dtype=mx.uint32)  # noqa: E731
    md = {"general.architecture": arch}
    for k, v in {"embedding_length": HIDDEN, "block_count": 1, "feed_forward_length": FFN,
                 "attention.head_count": HEADS, "attention.head_count_kv": KV, "context_length": 256}.items():
        md[f"{arch}.{k}"] = u(v)
    md[f"{arch}.attention.layer_norm_rms_epsilon"] = mx.array(1e-5)
    md[f"{arch}.rope.freq_base"] = mx.array(10000.0)
    return md


def _tensors(output=False):
    shapes = {"token_embd.weight": (VOCAB, HIDDEN), "output_norm.weight": (HIDDEN,),
              "blk.0.attn_norm.weight": (HIDDEN,), "blk.0.ffn_norm.weight": (HIDDEN,),
              "blk.0.attn_q.weight": (HIDDEN, HIDDEN), "blk.0.attn_k.weight": (KV * 16, HIDDEN),
              "blk.0.attn_v.weight": (KV * 16, HIDDEN), "blk.0.attn_output.weight": (HIDDEN, HIDDEN),
              "blk.0.ffn_gate.weight": (FFN, HIDDEN), "blk.0.ffn_up.weight": (FFN, HIDDEN),
              "blk.0.ffn_down.weight": (HIDDEN, FFN)}
    if output:
        shapes["output.weight"] = (VOCAB, HIDDEN)
    mx.random.seed(0)
    return {k: (0.05 * mx.random.normal(s)).astype(mx.float16) for k, s in shapes.items()}


def test_wrong_architecture(tmp_path):
    path = str(tmp_path / "m.gguf")
    mx.save_gguf(path, _tensors(), _metadata("qwen2"))
    with pytest.raises(ValueError, match=r"general.architecture 'qwen2' is not supported"):
        gguf.load_gguf(path)


def test_name_mapping():
    assert gguf.mlx_name("blk.7.attn_q.scales") == "model.layers.7.self_attn.q_proj.scales"
    assert gguf.mlx_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert gguf.mlx_name("token_embd.weight") == "model.embed_tokens.weight"
    assert gguf.mlx_name("output.weight") == "lm_head.weight"
    with pytest.raises(ValueError, match="blk.0.attn_qkv.weight"):
        gguf.mlx_name("blk.0.attn_qkv.weight")


@pytest.mark.parametrize("output", [False, True])
def test_float_model_config_and_forward(tmp_path, output):
    """F16 tensors: float layers; config from the metadata; tied embeddings without output.weight;
    the loaded tensors are the file's."""
    path = str(tmp_path / "m.gguf")
    tensors = _tensors(output)
    mx.save_gguf(path, tensors, _metadata())
    from mlx_fp4.checkpoints.gguf import gguf_config

    weights, md = mx.load(path, return_metadata=True)
    cfg = gguf_config(md, weights)
    assert cfg["hidden_size"] == HIDDEN and cfg["num_key_value_heads"] == KV and cfg["head_dim"] == 16
    assert cfg["rope_traditional"] is True and cfg["tie_word_embeddings"] is (not output)
    # no tokenizer metadata in this file: build the model part only
    from mlx_lm.models import llama

    model = llama.Model(llama.ModelArgs.from_dict({**cfg, "vocab_size": VOCAB}))
    model.load_weights([(gguf.mlx_name(k), v) for k, v in weights.items()], strict=True)
    assert mx.array_equal(model.model.layers[0].mlp.down_proj.weight, tensors["blk.0.ffn_down.weight"])
    assert model(mx.array([[1, 2, 3]])).shape == (1, 3, VOCAB)


def _write_raw(path, name, ggml_type, shape, nbytes):
    """A one-tensor GGUF v3 file with raw (zero) data of a ggml type mx.load may not read."""
    def s(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    out = b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + s("general.architecture") + struct.pack("<I", 8) + s("llama")
    out += s(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape[::-1])
    out += struct.pack("<IQ", ggml_type, 0)
    out += b"\0" * ((-len(out)) % 32)
    with open(path, "wb") as f:
        f.write(out + bytes(nbytes))


@pytest.mark.parametrize("ggml_type,name,block_bytes", [(6, "Q5_0", 22), (7, "Q5_1", 24)])
def test_unreadable_type_names_tensor_and_type(tmp_path, ggml_type, name, block_bytes):
    path = str(tmp_path / "q.gguf")
    _write_raw(path, "blk.0.attn_q.weight", ggml_type, (2, 64), 4 * block_bytes)
    assert gguf.gguf_tensor_types(path) == {"blk.0.attn_q.weight": name}
    with pytest.raises(ValueError, match=rf"tensor 'blk.0.attn_q.weight' has GGML type {name}"):
        gguf.load_gguf(path)


def test_not_gguf(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"nope" + bytes(60))
    with pytest.raises((ValueError, RuntimeError)):
        gguf.load_gguf(str(path))


def test_q4_0_tensor_becomes_affine_layer(tmp_path):
    """A Q4_0 tensor comes back from mx.load as affine 4-bit group 32; the loader quantizes that
    layer with nn.quantize and loads the file's bytes into it."""
    path = str(tmp_path / "q.gguf")
    _write_raw(path, "blk.0.attn_q.weight", 2, (HIDDEN, HIDDEN), HIDDEN * HIDDEN // 32 * 18)
    w = mx.load(path)
    assert w["blk.0.attn_q.weight"].dtype == mx.uint32 and "blk.0.attn_q.biases" in w
    assert gguf._affine_bits(w, "blk.0.attn_q") == 4
    layer = nn.Linear(HIDDEN, HIDDEN, bias=False)
    ql = nn.QuantizedLinear.from_linear(layer, group_size=32, bits=4)
    ql.load_weights([(k.split(".")[-1], v) for k, v in w.items()])
    assert ql(mx.ones((1, HIDDEN))).shape == (1, HIDDEN)
