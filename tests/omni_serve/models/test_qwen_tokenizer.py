from __future__ import annotations

from omni_serve.models.common.qwen_tokenizer import (
    QWEN_SPECIAL_TOKENS,
    VOCAB_SIZE,
    build_tokenizer,
    special_token_id,
)


def test_roles_are_single_tokens_and_specials_keep_qwen_order():
    tok = build_tokenizer()
    assert len(tok) == VOCAB_SIZE
    for role, want in (("user", 258), ("assistant", 266), ("system", 271)):
        assert tok("<|im_start|>" + role + "\n")["input_ids"] == [301, want, 10]
    ids = tok.convert_tokens_to_ids(QWEN_SPECIAL_TOKENS)
    assert ids == list(range(300, 300 + len(QWEN_SPECIAL_TOKENS)))
    assert special_token_id("<|audio_pad|>") == 332


def test_any_text_round_trips():
    tok = build_tokenizer()
    text = "Héllo, wörld! 12 🎧\n\tsystem user"
    assert tok.decode(tok(text)["input_ids"]) == text


def test_chat_template_ends_with_generation_prompt_and_placeholders():
    tok = build_tokenizer()
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "hi"}]},
    ]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")
    assert "<|audio_start|><|audio_pad|><|audio_end|>hi<|im_end|>" in text
