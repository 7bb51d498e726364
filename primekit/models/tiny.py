"""The embedded tiny model: a character-level tokenizer and a small random-init Qwen2 model.

It is what the CPU demo trains (SFT, then PRIME) on the procedural arithmetic task. Both are saved
as a standard Hugging Face directory, so plain `AutoModelForCausalLM.from_pretrained` and
`AutoTokenizer.from_pretrained` load them and every code path is the one a real model takes.
"""

from __future__ import annotations

from pathlib import Path

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)
# Newline plus printable ASCII (space .. tilde): one token each, ids 3..98.
CHARACTERS = "\n" + "".join(chr(c) for c in range(32, 127))


def _byte_symbols() -> dict[int, str]:
    """The byte -> printable-symbol table of byte-level BPE (GPT-2 style).

    Printable Latin-1 bytes stand for themselves; the other 68 bytes are shifted to code points
    256, 257, ... in byte order (so space is "Ġ" and newline "Ċ").
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in keep}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def build_char_tokenizer():
    """A character-level `PreTrainedTokenizerFast`: one token per character, exact round trip.

    Vocabulary (259): ids 0, 1, 2 are <pad>, <eos>, <unk>; ids 3..98 are "\n" and printable
    ASCII, one token per character; ids 99..258 are the remaining byte values, so any other
    character is encoded as its UTF-8 bytes instead of being lost. <eos> doubles as bos. Encoding
    adds no special tokens; `decode(encode(s)) == s` for every NFC-normalised string (the task
    text is ASCII). <unk> is never produced; it exists for tools that expect one.

    Why byte-level rather than a WordLevel vocabulary of characters: transformers 5 loads any
    tokenizer saved next to a `qwen2` config as `Qwen2Tokenizer`, which rebuilds a byte-level BPE
    (NFC normaliser, ByteLevel pre-tokenizer and decoder) from the saved vocabulary. Building
    exactly that shape here (a BPE with no merges over byte symbols) makes the tokenizer we
    build and the one `AutoTokenizer.from_pretrained` returns behave identically.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = _byte_symbols()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARACTERS:
        vocab[symbols[ord(ch)]] = len(vocab)
    for b in range(256):
        vocab.setdefault(symbols[b], len(vocab))

    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    # Every character its own pre-token; with no merges BPE then yields one token per byte.
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        # The default clean-up would delete the space in "x ." and break the exact round trip.
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )


def build_tiny_model(
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 512,
    max_position_embeddings: int = 512,
    seed: int = 0,
) -> Path:
    """Build a random-init Qwen2 causal LM over `build_char_tokenizer()` and save it to out_dir.

    The defaults give about 1.06 M parameters (tied input/output embeddings). Initialisation is
    reproducible from `seed`. Returns the directory, which holds config.json,
    generation_config.json, model.safetensors and the tokenizer files.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    for name, value in [
        ("hidden_size", hidden_size),
        ("num_layers", num_layers),
        ("num_heads", num_heads),
        ("intermediate_size", intermediate_size),
        ("max_position_embeddings", max_position_embeddings),
    ]:
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if hidden_size % num_heads or (hidden_size // num_heads) % 2:
        raise ValueError(
            f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads}) "
            "into an even head dimension (rotary embeddings need one)"
        )

    from primekit.models.hf import save_model

    tokenizer = build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        max_window_layers=num_layers,
        use_sliding_window=False,
    )
    # fork_rng keeps the caller's global RNG stream untouched by the seeded initialisation.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=64,
    )
    return save_model(model, tokenizer, out_dir)
