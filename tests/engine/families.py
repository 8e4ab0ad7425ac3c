"""Tiny configs of ten model families, at shapes the activation calibration never used.

Widths: 6 heads (the calibration uses 2, 4 and 8), hidden 96, MLP 200, vocabulary 700.
Dropout is off so that a forward saves the same tensors every time.
"""

import functools

import torch
import transformers as tf

H, HEADS, F, V = 96, 6, 200, 700


def _llama(**kw):
    return tf.LlamaConfig(hidden_size=H, intermediate_size=F, num_hidden_layers=2,
                          num_attention_heads=HEADS, vocab_size=V, max_position_embeddings=128,
                          **kw)


FAMILIES = {
    # grouped-query attention: 6 query heads share 3 key/value heads
    "llama-gqa": lambda: _llama(num_key_value_heads=3),
    # heads x head_dim = 6 x 24 = 144, not the hidden size 96
    "llama-head-dim": lambda: _llama(num_key_value_heads=6, head_dim=24),
    "qwen2": lambda: tf.Qwen2Config(hidden_size=H, intermediate_size=F, num_hidden_layers=2,
                                    num_attention_heads=HEADS, num_key_value_heads=2,
                                    vocab_size=V, max_position_embeddings=128),
    "mistral": lambda: tf.MistralConfig(hidden_size=H, intermediate_size=F, num_hidden_layers=2,
                                        num_attention_heads=HEADS, num_key_value_heads=2,
                                        vocab_size=V, max_position_embeddings=128),
    "bert": lambda: tf.BertConfig(hidden_size=H, intermediate_size=F, num_hidden_layers=2,
                                  num_attention_heads=HEADS, vocab_size=V,
                                  max_position_embeddings=128, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0),
    "gpt2": lambda: tf.GPT2Config(n_embd=H, n_layer=2, n_head=HEADS, n_inner=F, vocab_size=V,
                                  n_positions=128, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0),
    "opt": lambda: tf.OPTConfig(hidden_size=H, ffn_dim=F, num_hidden_layers=2,
                                num_attention_heads=HEADS, vocab_size=V, word_embed_proj_dim=H,
                                max_position_embeddings=128, dropout=0.0, attention_dropout=0.0),
    "gpt-neox": lambda: tf.GPTNeoXConfig(hidden_size=H, intermediate_size=F, num_hidden_layers=2,
                                         num_attention_heads=HEADS, vocab_size=V,
                                         max_position_embeddings=128, hidden_dropout=0.0,
                                         attention_dropout=0.0),
    "t5": lambda: tf.T5Config(d_model=H, d_ff=F, num_layers=2, num_decoder_layers=2,
                              num_heads=HEADS, d_kv=24, vocab_size=V, dropout_rate=0.0),
    "bart": lambda: tf.BartConfig(d_model=H, encoder_ffn_dim=F, decoder_ffn_dim=F,
                                  encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                                  vocab_size=V, max_position_embeddings=128, dropout=0.0,
                                  attention_dropout=0.0, activation_dropout=0.0),
}


@functools.cache
def causal_lm_folder(family: str, root: str) -> str:
    """A causal LM of ``family`` with seeded random weights, saved once to ``root``."""
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(FAMILIES[family]()).save_pretrained(root)
    return root
