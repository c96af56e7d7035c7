"""Shared fixtures: tiny random Llama/Mistral/Qwen2 checkpoints built with transformers (no
downloads), a tiny byte-level BPE tokenizer trained on stdlib source, and the default GGUF model
(SmolLM2-135M-Instruct, for slow tests).

Tiny models are re-initialised with large weights (and random norm weights and biases) so that
logits are O(1) and a wrong rope, mask or bias shows up far above the comparison tolerance.
"""

from __future__ import annotations

import inspect
import json
import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TINY_SIZES = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128)

# name -> (config class, config overrides, save_pretrained kwargs, weight dtype)
TINY_VARIANTS: dict[str, tuple[str, dict, dict, str]] = {
    "llama": ("LlamaConfig", {}, {}, "float32"),
    "llama_tied": ("LlamaConfig", {"tie_word_embeddings": True}, {}, "float32"),
    "llama_attn_bias": ("LlamaConfig", {"attention_bias": True}, {}, "float32"),
    "llama_head_dim": ("LlamaConfig", {"head_dim": 32}, {}, "float32"),
    "llama3_rope": ("LlamaConfig", {"rope_theta": 500000.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}}, {}, "float32"),
    "llama_linear_rope": ("LlamaConfig", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
                          {}, "float32"),
    "llama_sharded": ("LlamaConfig", {}, {"max_shard_size": "100KB"}, "float32"),
    "llama_bf16": ("LlamaConfig", {}, {}, "bfloat16"),
    "mistral": ("MistralConfig", {"sliding_window": 8}, {}, "float32"),
    "qwen2": ("Qwen2Config", {}, {}, "float32"),
    "qwen2_tied": ("Qwen2Config", {"tie_word_embeddings": True}, {}, "float32"),
    # Qwen2.5 0.5B-like: tied, theta 1e6, a sliding window configured but not used
    "qwen2_5": ("Qwen2Config", {"tie_word_embeddings": True, "rope_theta": 1e6,
                                "rms_norm_eps": 1e-6, "use_sliding_window": False,
                                "sliding_window": 32768, "max_window_layers": 1}, {}, "float32"),
    # every layer slides (layers from max_window_layers = 0 on)
    "qwen2_swa": ("Qwen2Config", {"use_sliding_window": True, "sliding_window": 8,
                                  "max_window_layers": 0}, {}, "float32"),
    # Llama 3.2 1B-like: tied, 128k vocabulary, llama3 RoPE scaling (factor 32); a small
    # original context so that prefill and decode run past it
    "llama32": ("LlamaConfig", {"tie_word_embeddings": True, "vocab_size": 128256,
                                "rope_theta": 500000.0, "rope_scaling": {
                                    "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 32}}, {}, "float32"),
    # other architectures (issue #8, ARCH_VARIANTS): partial rotary, fused layouts, parallel
    # residuals
    "codegen": ("CodeGenConfig", {"rotary_dim": 8}, {}, "float32"),
    "gpt2": ("GPT2Config", {}, {}, "float32"),
    "gptj": ("GPTJConfig", {"rotary_dim": 8}, {}, "float32"),
    "gpt_neox": ("GPTNeoXConfig", {"rotary_pct": 0.5}, {}, "float32"),
    "gpt_neox_sequential": ("GPTNeoXConfig", {"rotary_pct": 0.25, "use_parallel_residual": False,
                                              "hidden_act": "gelu_new"}, {}, "float32"),
    "opt": ("OPTConfig", {}, {}, "float32"),
    "phi2": ("PhiConfig", {"partial_rotary_factor": 0.5}, {}, "float32"),
    "phi3": ("Phi3Config", {"pad_token_id": 0}, {}, "float32"),
    # Qwen3 0.6B-like: QK-norm, GQA, head_dim (32) != hidden / heads (16), tied embeddings
    "qwen3": ("Qwen3Config", {"head_dim": 32, "tie_word_embeddings": True}, {}, "float32"),
    # Gemma 3 270M-like: six layers, the last one global (the released 5:1 pattern), sliding
    # window 8, QK-norm, sandwich norms, GeGLU, scaled embeddings, GQA, tied, head_dim 32
    "gemma3": ("Gemma3TextConfig", {"head_dim": 32, "num_hidden_layers": 6, "sliding_window": 8,
                                    "query_pre_attn_scalar": 32}, {}, "float32"),
    # the other knobs: attention scaled by query_pre_attn_scalar != head_dim, linear RoPE
    # scaling on the global layers, a final logit soft cap, an explicit layer_types mix
    "gemma3_scaled": ("Gemma3TextConfig", {
        "head_dim": 32, "num_hidden_layers": 3, "sliding_window": 8, "query_pre_attn_scalar": 24,
        "final_logit_softcapping": 3.0,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 4.0,
                                               "rope_theta": 1e6},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
        {}, "float32"),
}
_GPT_SIZES = dict(n_embd=64, n_layer=2, n_head=4, n_positions=512)
# config classes whose size keys differ from TINY_SIZES
CONFIG_SIZES = {
    "CodeGenConfig": {**_GPT_SIZES, "n_ctx": 512},
    "GPT2Config": _GPT_SIZES,
    "GPTJConfig": _GPT_SIZES,
    "GPTNeoXConfig": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=128, max_position_embeddings=512),
    "OPTConfig": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
                      word_embed_proj_dim=64, max_position_embeddings=512),
}


def _training_text() -> list[str]:
    import json as json_mod
    import string

    texts = [inspect.getsource(m) for m in (textwrap, json_mod.decoder, string)]
    texts += ["Hello world! The quick brown fox jumps over the lazy dog. 0123456789 " * 3]
    return texts


def build_tiny_tokenizer(folder: Path) -> transformers.PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_training_text(), trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>",
        pad_token="<|endoftext|>", unk_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


def _randomize(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or ".ln_" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif "embed" in name or name.endswith(("wte.weight", "wpe.weight")):
                p.copy_(torch.randn(p.shape, generator=gen))
            else:  # std 1/sqrt(fan_in) * 1.5: O(1) activations, peaky attention
                p.copy_(1.5 * torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def build_tiny_model(folder: Path, variant: str, tokenizer_folder: Path, vocab_size: int) -> None:
    cls_name, overrides, save_kwargs, dtype = TINY_VARIANTS[variant]
    config_cls = getattr(transformers, cls_name)
    sizes = CONFIG_SIZES.get(cls_name, {**TINY_SIZES, "max_position_embeddings": 512})
    config = config_cls(**{**sizes, "vocab_size": vocab_size, "bos_token_id": 0,
                           "eos_token_id": 2, **overrides})  # a larger vocab_size may override
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize(model, seed=sum(map(ord, variant)))
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True, **save_kwargs)
    for f in tokenizer_folder.iterdir():
        shutil.copy(f, folder / f.name)


ISAS = ["scalar", "avx2", "avx512"]


@pytest.fixture(params=ISAS)
def isa(request):
    """Run a test on the portable scalar path, the AVX2 path and the AVX-512 path (W8A8 and
    sparse int4 kernels; skipped on CPUs without it). Used by tests/kernels and by the native
    forward's tests in tests/engine."""
    from sparsellm import kernels
    from sparsellm.kernels._ext import native

    if request.param == "avx2" and not native().cpu_supports_avx2():
        pytest.skip("CPU without AVX2/FMA")
    if request.param == "avx512" and not native().cpu_supports_avx512():
        pytest.skip("CPU without AVX512 F/BW/VL/VNNI/VBMI2")
    kernels.set_isa(request.param)
    yield request.param
    kernels.set_isa("auto")


@pytest.fixture(scope="session", autouse=True)
def weights_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Converted weights are cached in a folder of this session (also for the CLI and server
    subprocesses, which inherit the environment), never in the user's ~/.cache."""
    folder = tmp_path_factory.mktemp("weights_cache")
    patch = pytest.MonkeyPatch()
    patch.setenv("SPARSELLM_CACHE_DIR", str(folder))
    yield folder
    patch.undo()


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_tokenizer")
    build_tiny_tokenizer(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_hf_tokenizer(tiny_tokenizer_dir: Path):
    return transformers.AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer_dir,
                   tiny_hf_tokenizer) -> Callable[[str], Path]:
    """tiny_model_dir(variant) -> a saved HF folder (built once per session)."""
    built: dict[str, Path] = {}

    def get(variant: str) -> Path:
        if variant not in built:
            folder = tmp_path_factory.mktemp(f"tiny_{variant}")
            build_tiny_model(folder, variant, tiny_tokenizer_dir, len(tiny_hf_tokenizer))
            built[variant] = folder
        return built[variant]

    return get


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_model_dir) -> Path:
    return tiny_model_dir("llama")


@pytest.fixture(scope="session")
def hf_model() -> Callable[[Path], torch.nn.Module]:
    """hf_model(folder) -> the transformers model in fp32, eager attention, eval mode (cached)."""
    cache: dict[Path, torch.nn.Module] = {}

    def get(folder: Path) -> torch.nn.Module:
        if folder not in cache:
            cache[folder] = transformers.AutoModelForCausalLM.from_pretrained(
                folder, dtype=torch.float32, attn_implementation="eager").eval()
        return cache[folder]

    return get


def hf_logits(model: torch.nn.Module, ids: list[int]) -> np.ndarray:
    """(len(ids), vocab) fp32 logits of one sequence from a transformers model."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


@pytest.fixture(scope="session")
def hf_logits_fn():
    return hf_logits


@pytest.fixture(scope="session")
def token_ids() -> Callable[[int, int], list[int]]:
    """token_ids(n, seed) -> n random ids from the tiny vocabulary's non-special range."""

    def make(n: int, seed: int = 0) -> list[int]:
        rng = np.random.default_rng(seed)
        return rng.integers(len(SPECIAL_TOKENS), 380, size=n).tolist()

    return make


# ---- the default model (slow tests) --------------------------------------------------------------
@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from sparsellm.models.registry import resolve_registered

    try:
        return resolve_registered("smollm2-135m-instruct")
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def smollm2_checkpoint(smollm2_path):
    from sparsellm.models import load_checkpoint

    return load_checkpoint(smollm2_path)


@pytest.fixture(scope="session")
def smollm2_hf_tokenizer(smollm2_path):
    return transformers.AutoTokenizer.from_pretrained(smollm2_path.parent,
                                                      gguf_file=smollm2_path.name)


@pytest.fixture(scope="session")
def smollm2_hf_model(smollm2_path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_path.parent, gguf_file=smollm2_path.name, dtype=torch.float32).eval()


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2))


# ---- tiny GGUF files (SentencePiece vocabulary + tiny Llama weights) ---------------------------
SPM_SPECIALS = ["<unk>", "<s>", "</s>"]
SPM_CHAT_TOKENS = ["<|im_start|>", "<|im_end|>"]  # control tokens
SPM_USER_DEFINED = ["<think>"]


def build_spm_vocab() -> tuple[list[str], list[float], list[int]]:
    """A made-up SentencePiece BPE vocabulary: specials, 256 <0xNN> byte tokens, pieces learned
    from stdlib text (scores = -rank, so earlier merges score higher), chat and user tokens."""
    from tokenizers import SentencePieceBPETokenizer

    spm = SentencePieceBPETokenizer(add_prefix_space=True)
    spm.train_from_iterator(_training_text(), vocab_size=300, min_frequency=2,
                            show_progress=False, special_tokens=[])
    pieces = [t for t, _ in sorted(spm.get_vocab().items(), key=lambda kv: kv[1])]
    tokens = SPM_SPECIALS + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    for rank, piece in enumerate(pieces):
        tokens.append(piece)
        types.append(1)
        scores.append(-float(rank))
    for t in SPM_CHAT_TOKENS:
        tokens.append(t)
        types.append(3)
        scores.append(0.0)
    for t in SPM_USER_DEFINED:
        tokens.append(t)
        types.append(4)
        scores.append(0.0)
    return tokens, scores, types


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.LlamaModel.permute: HF half-split rope rows -> interleaved."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


_HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _finish_gguf(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _add_spm_vocab(w, tokens: list[str], scores: list[float], types: list[int],
                   chat_template: str | None) -> None:
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if chat_template:
        w.add_chat_template(chat_template)


def write_tiny_llama_gguf(path: Path, qtype: str = "F32", *, with_weights: bool = True,
                          arch: str = "llama", chat_template: str | None = CHAT_TEMPLATE,
                          ) -> torch.nn.Module:
    """Write a tiny Llama GGUF the way llama.cpp's converter does; return the torch model."""
    import gguf

    tokens, scores, types = build_spm_vocab()
    config = transformers.LlamaConfig(**TINY_SIZES, vocab_size=len(tokens),
                                      max_position_embeddings=256, bos_token_id=1,
                                      eos_token_id=2, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    _randomize(model, seed=7)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    w.add_vocab_size(len(tokens))
    _add_spm_vocab(w, tokens, scores, types, chat_template)
    quant = getattr(gguf.GGMLQuantizationType, qtype)
    if with_weights:
        for name, t in model.state_dict().items():
            arr = t.float().numpy()
            key = name.split(".", 3)[3] if name.startswith("model.layers.") else name
            gname = _HF_TO_GGUF[key]
            if name.startswith("model.layers."):
                gname = f"blk.{name.split('.')[2]}.{gname}"
            if key == "self_attn.q_proj.weight":
                arr = _llama_cpp_permute(arr, config.num_attention_heads)
            elif key == "self_attn.k_proj.weight":
                arr = _llama_cpp_permute(arr, config.num_key_value_heads)
            if arr.ndim == 2 and quant != gguf.GGMLQuantizationType.F32:
                w.add_tensor(gname, gguf.quants.quantize(arr, quant), raw_dtype=quant)
            else:
                w.add_tensor(gname, arr)
    _finish_gguf(w)
    return model


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Callable[[str], tuple[Path, torch.nn.Module]]:
    """tiny_gguf(qtype) -> (path of a tiny SentencePiece-vocab Llama GGUF, its torch model)."""
    built: dict[str, tuple[Path, torch.nn.Module]] = {}

    def get(qtype: str = "F32") -> tuple[Path, torch.nn.Module]:
        if qtype not in built:
            folder = tmp_path_factory.mktemp(f"gguf_{qtype}")
            path = folder / f"tiny-{qtype}.gguf"
            built[qtype] = (path, write_tiny_llama_gguf(path, qtype))
        return built[qtype]

    return get


@pytest.fixture(scope="session")
def spm_gguf():
    """Parts for writing a GGUF by hand: (tokens, scores, types) of the made-up SentencePiece
    vocabulary, add_vocab(writer) and finish(writer)."""
    tokens, scores, types = build_spm_vocab()
    return ((tokens, scores, types),
            lambda w: _add_spm_vocab(w, tokens, scores, types, None), _finish_gguf)


@pytest.fixture(scope="session")
def gguf_writer():
    return write_tiny_llama_gguf


# ---- tiny GGUF files of other architectures, written the way llama.cpp's converter does -------
# variant -> (GGUF arch, config overrides: the converter writes phi2's feed_forward_length as
# 4 * n_embd and head_count_kv = head_count; GGUF does not record GPT-NeoX's hidden_act, which
# the loader takes to be the architecture's default, exact GELU)
GGUF_ARCH_VARIANTS = {"gpt2": ("gpt2", {}), "gpt_neox": ("gptneox", {}),
                      "gpt_neox_sequential": ("gptneox", {"hidden_act": "gelu"}),
                      "phi2": ("phi2", {"intermediate_size": 256, "num_key_value_heads": 4}),
                      "phi3": ("phi3", {}), "qwen3": ("qwen3", {}), "qwen2_5": ("qwen2", {}),
                      "llama3_rope": ("llama", {}), "gemma3": ("gemma3", {})}


def llama3_rope_factors(hp: dict) -> np.ndarray:
    """rope_freqs.weight as convert_hf_to_gguf.py LlamaModel.generate_extra_tensors computes it
    for llama3 RoPE scaling (float32 frequencies, one divisor per frequency). The converter
    reads original_max_position_embeddings from the top level of config.json (default 8192,
    which is the value inside rope_scaling for every released Llama 3.x); the tiny model's
    small original context is inside rope_parameters, so it is read from there."""
    import math

    rope = hp["rope_parameters"]
    dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    freqs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_context_len = rope["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            factors.append(1)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(factors, dtype=torch.float32).numpy()


def write_tiny_arch_gguf(path: Path, variant: str) -> torch.nn.Module:
    """A tiny random `variant` model as llama.cpp's convert_hf_to_gguf.py writes it (metadata
    keys per architecture, gguf TensorNameMap names, GPT-2 Conv1D weights transposed, GPT-NeoX
    qkv regrouped from per-head [q k v] to [all q; all k; all v], Llama Q/K rows permuted to
    interleaved RoPE and llama3 RoPE scaling as rope_freqs.weight); returns the torch model."""
    import gguf
    from safetensors.torch import load_file

    arch, extra = GGUF_ARCH_VARIANTS[variant]
    cls_name, overrides, _, _ = TINY_VARIANTS[variant]
    tokens, scores, types = build_spm_vocab()
    sizes = CONFIG_SIZES.get(cls_name, {**TINY_SIZES, "max_position_embeddings": 512})
    config = getattr(transformers, cls_name)(**{**sizes, **overrides, **extra,
                                                "vocab_size": len(tokens), "bos_token_id": 1,
                                                "eos_token_id": 2})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    _randomize(model, seed=11)
    hf_dir = path.parent / f"{path.stem}-hf"
    model.save_pretrained(hf_dir, safe_serialization=True)
    hp = config.to_dict()
    rope = hp.get("rope_parameters") or {}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(config.num_hidden_layers)
    if arch == "gpt2":
        w.add_context_length(hp["n_positions"])
        w.add_embedding_length(hp["n_embd"])
        w.add_feed_forward_length(4 * hp["n_embd"])
        w.add_head_count(hp["n_head"])
        w.add_layer_norm_eps(hp["layer_norm_epsilon"])
    elif arch == "gptneox":
        head_dim = hp["hidden_size"] // hp["num_attention_heads"]
        w.add_context_length(hp["max_position_embeddings"])
        w.add_embedding_length(hp["hidden_size"])
        w.add_feed_forward_length(hp["intermediate_size"])
        w.add_rope_dimension_count(int(rope["partial_rotary_factor"] * head_dim))
        w.add_head_count(hp["num_attention_heads"])
        w.add_parallel_residual(hp.get("use_parallel_residual", True))
        w.add_layer_norm_eps(hp["layer_norm_eps"])
    elif arch in ("llama", "qwen2", "qwen3", "gemma3"):
        # TextModel.set_gguf_parameters (+ LlamaModel's, Gemma3Model's)
        w.add_context_length(hp["max_position_embeddings"])
        w.add_embedding_length(hp["hidden_size"])
        w.add_feed_forward_length(hp["intermediate_size"])
        w.add_head_count(hp["num_attention_heads"])
        w.add_head_count_kv(hp["num_key_value_heads"])
        w.add_rope_freq_base(rope.get("full_attention", rope)["rope_theta"])  # Gemma: global
        w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
        if hp.get("head_dim") is not None:
            w.add_key_length(hp["head_dim"])
            w.add_value_length(hp["head_dim"])
        if arch == "llama":
            w.add_vocab_size(hp["vocab_size"])
            w.add_rope_dimension_count(hp.get("head_dim") or
                                       hp["hidden_size"] // hp["num_attention_heads"])
            if rope.get("rope_type") == "llama3":
                w.add_tensor("rope_freqs.weight", llama3_rope_factors(hp))
        if arch == "gemma3":
            w.add_sliding_window(hp["sliding_window"])
    else:  # phi2, phi3
        n_embd, n_head = hp["hidden_size"], hp["num_attention_heads"]
        w.add_context_length(hp["max_position_embeddings"])
        w.add_embedding_length(n_embd)
        w.add_head_count(n_head)
        w.add_rope_dimension_count(int(rope.get("partial_rotary_factor", 1.0) * n_embd) // n_head)
        if arch == "phi2":
            w.add_feed_forward_length(4 * n_embd)
            w.add_head_count_kv(n_head)
            w.add_layer_norm_eps(hp["layer_norm_eps"])
        else:
            w.add_feed_forward_length(hp["intermediate_size"])
            w.add_head_count_kv(hp["num_key_value_heads"])
            w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
            w.add_rope_freq_base(rope["rope_theta"])
            w.add_sliding_window(hp.get("sliding_window") or 0)
    _add_spm_vocab(w, tokens, scores, types, None)
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()),
                                     config.num_hidden_layers)
    n_head = config.num_attention_heads
    for name, t in load_file(hf_dir / "model.safetensors").items():
        if arch == "gpt2" and name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
            t = t.transpose(1, 0)
        if arch == "gptneox" and ".query_key_value." in name:
            t = t.reshape(n_head, 3, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = n_head if "q_proj" in name else config.num_key_value_heads
            t = torch.from_numpy(_llama_cpp_permute(t.numpy(), heads))
        if arch == "gemma3" and name.endswith("norm.weight"):
            t = t + 1  # Gemma3Model.modify_tensors: llama.cpp's RMSNorm multiplies by w alone
        gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gname is not None, name
        w.add_tensor(gname, np.ascontiguousarray(t.float().numpy()))
    _finish_gguf(w)
    return model


@pytest.fixture(scope="session")
def tiny_arch_gguf(tmp_path_factory) -> Callable[[str], tuple[Path, torch.nn.Module]]:
    """tiny_arch_gguf(variant) -> (path of a tiny GGUF of that architecture, its torch model)."""
    built: dict[str, tuple[Path, torch.nn.Module]] = {}

    def get(variant: str) -> tuple[Path, torch.nn.Module]:
        if variant not in built:
            path = tmp_path_factory.mktemp(f"gguf_{variant}") / f"tiny-{variant}.gguf"
            built[variant] = (path, write_tiny_arch_gguf(path, variant))
        return built[variant]

    return get
