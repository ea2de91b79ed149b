"""The decode benchmark's model presets: the layer shapes of public configs (mlx-lm model modules and
their ModelArgs), built with random weights (no download), and CI-sized ones."""

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
}
