"""Tiny mlx-lm models and a tokenizer for folder-level tests (no downloads): a Llama config, a
WordLevel tokenizer over the tokens "t0".."t127" written with transformers' save_pretrained."""

import json

import mlx.core as mx

CONFIG = dict(
    model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
    num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=128,
    tie_word_embeddings=False, max_position_embeddings=256,
)
PROMPT = "t1 t17 t42 t99 t5"


def tiny_llama(seed=0, config=CONFIG):
    from mlx_lm.models import llama

    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs(**config))
    mx.eval(model.parameters())
    return model


def write_tokenizer(folder, vocab_size=CONFIG["vocab_size"]):
    """tokenizer.json + tokenizer_config.json in ``folder``; "t1" is the end of sequence."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="t1", unk_token="t0").save_pretrained(str(folder))
    return folder


def write_float_model(folder, seed=0, config=CONFIG):
    """A float mlx-lm folder (weights, config, tokenizer), as a converter's input."""
    from mlx_lm.utils import save_config, save_model

    folder.mkdir(parents=True, exist_ok=True)
    model = tiny_llama(seed, config)
    save_model(folder, model)
    save_config(dict(config), folder / "config.json")
    write_tokenizer(folder)
    return model


def read_json(path):
    return json.loads(path.read_text())


# Greedy decoding of token ids (no tokenizer), for "same tokens as the dequantized model" tests.
TOKEN_PROMPT = [1, 17, 42, 99, 5, 200, 3, 64, 7, 11]
GREEDY_STEPS = 8


def greedy(model, prompt=TOKEN_PROMPT, steps=GREEDY_STEPS):
    """(tokens, log-probabilities per step) of mlx-lm's greedy generate_step."""
    import numpy as np
    from mlx_lm.generate import generate_step

    toks, logps = [], []
    for tok, lp in generate_step(mx.array(prompt), model, max_tokens=steps):
        toks.append(int(tok))
        logps.append(np.array(lp.astype(mx.float32)))
    return toks, np.stack(logps)


def same_greedy(got, want, atol=1e-4):
    """Log-probabilities within atol at every step up to the first different token, which must be
    a near tie (within atol) in ``want``."""
    import numpy as np

    (gt, gl), (wt, wl) = got, want
    for i, (a, b) in enumerate(zip(gt, wt)):
        np.testing.assert_allclose(gl[i], wl[i], atol=atol, rtol=0, err_msg=f"step {i}")
        assert a == b or abs(wl[i][a] - wl[i][b]) <= atol, f"step {i}: token {a} != {b}"
        if a != b:
            return
    assert gt == wt
