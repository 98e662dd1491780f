"""An offline byte-level BPE tokenizer with Qwen's special tokens, for random-weight checkpoints.

Real Qwen checkpoints ship a 151k-token vocabulary; tiny models cannot afford that embedding
table and nothing may be downloaded. This tokenizer keeps what the serving code depends on:
byte-level coverage of any text, a family's special tokens (in the family's real order,
shifted to ``SPECIAL_BASE + (real_id - 151643)``) and the three chat roles as single tokens,
because transformers' Qwen3-Omni ``generate`` finds roles by token id. A family names its
media tokens (``SpecialTokens.named``: what Qwen's processors read off a tokenizer); the chat
template is built from them. The defaults are Qwen3's (Qwen3-Omni, and Qwen-Image's Qwen2.5-VL
text encoder, whose prompts use none of the media tokens).
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel
from transformers import PreTrainedTokenizerFast

VOCAB_SIZE = 384
SPECIAL_BASE = 300

# Merges in rank order. The first 16 make "user" (258), "assistant" (266) and "system" (271)
# single tokens, the layout the reference configs assume; the rest are common English pairs
# that only fill ids 272..299.
_ROLE_MERGES = [
    ("u", "s"),
    ("e", "r"),
    ("us", "er"),
    ("a", "s"),
    ("as", "s"),
    ("i", "s"),
    ("t", "a"),
    ("n", "t"),
    ("ta", "nt"),
    ("is", "tant"),
    ("ass", "istant"),
    ("s", "y"),
    ("t", "e"),
    ("sy", "s"),
    ("te", "m"),
    ("sys", "tem"),
]
_FILLER_MERGES = [
    ("t", "h"),
    ("h", "e"),
    ("i", "n"),
    ("a", "n"),
    ("o", "n"),
    ("r", "e"),
    ("Ġ", "t"),
    ("Ġ", "a"),
    ("e", "n"),
    ("o", "r"),
    ("Ġt", "he"),
    ("i", "t"),
    ("Ġ", "s"),
    ("a", "r"),
    ("Ġ", "w"),
    ("a", "l"),
    ("Ġ", "o"),
    ("Ġ", "c"),
    ("o", "u"),
    ("Ġ", "h"),
    ("e", "d"),
    ("Ġ", "i"),
    ("l", "e"),
    ("Ġ", "b"),
    ("Ġ", "f"),
    ("Ġ", "p"),
    ("i", "ng"),
    ("n", "g"),
]

# Qwen2/3 special tokens in their real order (151643 onward).
QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
]

# Qwen2's pre-tokenizer split (contractions, letters, single digits, punctuation, spaces).
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# What Qwen's multimodal processors read off the tokenizer, for Qwen3's layout.
QWEN3_NAMED_TOKENS = {
    "image_token": "<|image_pad|>",
    "audio_token": "<|audio_pad|>",
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}


def chat_template(named: dict[str, str]) -> str:
    """A chat template with one placeholder per media part, spelled with ``named`` tokens."""
    audio = named["audio_bos_token"] + named["audio_token"] + named["audio_eos_token"]
    image = named["vision_bos_token"] + named["image_token"] + named["vision_eos_token"]
    video = named["vision_bos_token"] + named["video_token"] + named["vision_eos_token"]
    return (
        "{% for message in messages %}"
        "<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for part in message['content'] %}"
        "{% if part['type'] == 'text' %}{{ part['text'] }}"
        f"{{% elif part['type'] in ('audio', 'input_audio') %}}{audio}"
        f"{{% elif part['type'] in ('image', 'image_url') %}}{image}"
        f"{{% elif part['type'] == 'video' %}}{video}"
        "{% endif %}{% endfor %}{% endif %}"
        "<|im_end|>\n"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


CHAT_TEMPLATE = chat_template(QWEN3_NAMED_TOKENS)


def special_token_id(token: str, special_tokens: list[str] = QWEN_SPECIAL_TOKENS) -> int:
    """The id of a Qwen special token in this tokenizer's layout."""
    return SPECIAL_BASE + special_tokens.index(token)


def build_tokenizer(
    special_tokens: list[str] = QWEN_SPECIAL_TOKENS,
    named: dict[str, str] = QWEN3_NAMED_TOKENS,
) -> PreTrainedTokenizerFast:
    """``special_tokens``: a family's special tokens in its real order (from 151643);
    ``named``: its media tokens by the names Qwen's processors read."""
    byte_chars = sorted(ByteLevel.alphabet(), key=_byte_value)
    vocab = {ch: i for i, ch in enumerate(byte_chars)}
    merges = _ROLE_MERGES + _FILLER_MERGES
    for left, right in merges:
        vocab[left + right] = len(vocab)
    assert len(vocab) == SPECIAL_BASE, len(vocab)
    bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    extra = [f"<|extra_{i}|>" for i in range(VOCAB_SIZE - SPECIAL_BASE - len(special_tokens))]
    tok.add_special_tokens(special_tokens + extra)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
        extra_special_tokens=dict(named),
    )
    fast.chat_template = chat_template(named)
    for role, want in (("user", 258), ("assistant", 266), ("system", 271)):
        got = fast.convert_tokens_to_ids(role)
        assert got == want, f"role {role!r} got id {got}, want {want}"
    return fast


def _byte_value(ch: str) -> int:
    """Order ByteLevel's alphabet by the byte each character stands for (GPT-2 mapping)."""
    code = ord(ch)
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    if code in printable:
        return code
    return sorted(set(range(256)) - set(printable))[code - 256]
