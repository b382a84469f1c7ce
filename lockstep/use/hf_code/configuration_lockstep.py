"""The configuration of a lockstep model exported for Hugging Face ``transformers``.

Written by ``lockstep export --format hf`` from the run's recipe; every field is the
recipe's model setting under the name transformers users expect:

    vocab_size               V, the model's vocabulary (the tokenizer's, padded)
    hidden_size              D (d_model)
    intermediate_size        F, the SwiGLU width
    num_hidden_layers        L
    num_attention_heads      H query heads
    num_key_value_heads      G key/value heads (GQA: query head h reads KV head h // (H / G))
    head_dim                 Dh
    max_position_embeddings  the context the model was trained on (lockstep's seq_len)
    attention_window         W: a local layer's query i attends keys i - W + 1 .. i
    full_attention_layers    the layers that are fully causal (every 5th and the last)
    rope_theta               RoPE base (half-split pairs)
    rms_norm_eps             epsilon of every RMSNorm (the QK-norm's too)
    quantize                 int8 W8A8 attention and feed-forward linears (as trained)
    eod_token_id             lockstep's end-of-document token: it precedes every document,
                             so a prompt starts after it (also bos and eos here)
    tokenizer_vocab_size     the ids the tokenizer can produce (the rest are padding)

The window is not called ``sliding_window``, nor the layer list ``layer_types``:
transformers would then build caches that drop old keys, and this model's attention
indexes the cache by absolute position.
"""

from transformers import PretrainedConfig


class LockstepConfig(PretrainedConfig):
    model_type = "lockstep"

    def __init__(self, vocab_size=264, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
                 attention_window=128, full_attention_layers=None, rope_theta=500000.0, rms_norm_eps=1e-6,
                 quantize=True, eod_token_id=256, tokenizer_vocab_size=257, use_cache=True, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.max_position_embeddings = max_position_embeddings
        self.attention_window = attention_window
        if full_attention_layers is None:  # lockstep's rule: every 5th layer and the last
            full_attention_layers = [i for i in range(num_hidden_layers)
                                     if (i + 1) % 5 == 0 or i == num_hidden_layers - 1]
        self.full_attention_layers = list(full_attention_layers)
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.quantize = quantize
        self.eod_token_id = eod_token_id
        self.tokenizer_vocab_size = tokenizer_vocab_size
        for key in ("bos_token_id", "eos_token_id"):
            kwargs.setdefault(key, eod_token_id)
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)
        self.use_cache = use_cache  # after the base class, which treats it as a generation setting
