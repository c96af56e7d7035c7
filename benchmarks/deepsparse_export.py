"""A local HF Llama folder -> the KV-cache ONNX folder that DeepSparse 1.8's TextGeneration runs.

    python benchmarks/deepsparse_export.py HF_FOLDER OUT_FOLDER

Runs in DeepSparse's own venv (peers.py's docstring says how to make it), never in sparsellm's:
DeepSparse's licence allows benchmarking only. It is SparseML 1.8's own export, `sparseml.export(
task="text-generation")` (torch -> ONNX, then its KV-cache injection), with these local fixes:

- torch >= 2.9 exports through dynamo by default; SparseML's graph surgery reads the graph of the
  TorchScript exporter, so that one is asked for (dynamo=False).
- SparseML 1.8 targets transformers 4.40, whose tokenizers (0.19) cannot read the newer
  tokenizer.json of our folders (merges as pairs, `ignore_merges`), and whose from_pretrained
  wants the safetensors "format" metadata: the export reads a staged copy that has both.
- transformers 4.40 picks SDPA attention, whose ONNX form scales the transposed keys before the
  QK MatMul, so SparseML's cache injection concatenates on the wrong axis (DeepSparse: "Can't
  merge shape info"); the export asks for the eager attention its injection was written for.
- Its Llama KV-cache injection looks for the position ids and the causal mask as an older
  transformers built them (Range -> Unsqueeze, Expand -> Add) and stops on 4.40's graph ("Unable
  to find pattern"); LlamaInputs below wires DeepSparse's `positions` and `causal_mask` inputs in
  where 4.40 computes them (cache_position.unsqueeze(0); the 4-D mask's ScatterND), in every layer,
  and gives DeepSparse RoPE's cos and sin as table lookups, a form it compiles.

Checked on the SmolLM2-135M shape: DeepSparse's logits (prompt in 16-token chunks, then decode
steps) match transformers' fp32 ones within 1e-5. That export peaks at ~4.5 GB of RAM and ~2.5x
the ONNX size on disk (a staged copy, SparseML's copy from before the injection).
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from safetensors.torch import load_file, save_file
from sparseml.exporters.transforms.kv_cache import configs
from sparseml.exporters.transforms.kv_cache.transforms_base import AdditionalTransformsBase
from sparseml.onnx.utils.graph_editor import ONNXGraph

torch.onnx.export = functools.partial(torch.onnx.export, dynamo=False)


class LlamaInputs(AdditionalTransformsBase):
    """Feed `positions` (int64 [batch, new tokens]) and `causal_mask` (int64 1/0, [batch, 1, new
    tokens, sequence length]) to the graph instead of what it computes from attention_mask."""

    rope: tuple[np.ndarray, np.ndarray]  # cos, sin [max positions, head dim]: set by main()

    @staticmethod
    def rope_tables(config: dict) -> tuple[np.ndarray, np.ndarray]:
        """transformers 4.40's LlamaRotaryEmbedding, for every position at once."""
        if config.get("rope_scaling"):
            raise ValueError("rope_scaling is not supported here")
        dim = config["hidden_size"] // config["num_attention_heads"]
        base = config.get("rope_theta", 10000.0)
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        freqs = torch.outer(torch.arange(config["max_position_embeddings"]).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().numpy(), emb.sin().numpy()

    def transform(self, model: onnx.ModelProto) -> onnx.ModelProto:
        model = self.add_causal_mask_input(self.add_positions_input(model))
        graph = ONNXGraph(model)
        nodes = list(model.graph.node)
        positions = [child for node in nodes if node.op_type == "Range"
                     for child in graph.get_node_children(node) if child.op_type == "Unsqueeze"]
        masks = [node for node in nodes if node.op_type == "ScatterND"]
        if len(positions) != 1 or len(masks) != 1:
            raise ValueError(f"expected one position-ids Unsqueeze and one mask ScatterND, "
                             f"found {len(positions)} and {len(masks)}")
        # causal_mask AND attention_mask (padding), as transformers combines them: DeepSparse
        # stops on a graph input that nothing reads ("Assertion at .../execution/graph.cpp").
        # Then 1 -> 0.0 (attend), 0 -> float32 min (masked), as SparseML does for older graphs.
        name = self.CAUSAL_MASK_NAME
        model.graph.initializer.extend([
            numpy_helper.from_array(np.array([1, 2], np.int64), f"{name}_axes"),
            numpy_helper.from_array(np.array([1.0], np.float32), f"{name}_one"),
            numpy_helper.from_array(np.array([-np.finfo(np.float32).min], np.float32),
                                    f"{name}_limit")])
        model.graph.node.extend([
            helper.make_node("Unsqueeze", ["attention_mask", f"{name}_axes"], [f"{name}_pad"]),
            helper.make_node("Mul", [name, f"{name}_pad"], [f"{name}_and"]),
            helper.make_node("Cast", [f"{name}_and"], [f"{name}_cast"], to=TensorProto.FLOAT),
            helper.make_node("Sub", [f"{name}_cast", f"{name}_one"], [f"{name}_sub"]),
            helper.make_node("Mul", [f"{name}_sub", f"{name}_limit"], [f"{name}_float"])])
        # RoPE's cos and sin as lookups of `positions` in tables, as transformers < 4.38 had
        # them: DeepSparse stops on 4.40's form (a MatMul of the positions by the inverse
        # frequencies, then Cos and Sin: "Assertion at .../execution/graph.cpp") once the positions
        # are an input rather than constants it folds.
        swap = {positions[0].output[0]: self.POSITIONS_NAME, masks[0].output[0]: f"{name}_float"}
        for op, table in zip(("Cos", "Sin"), self.rope, strict=True):
            (node,) = [node for node in nodes if node.op_type == op]
            model.graph.initializer.append(numpy_helper.from_array(table, f"rope_{op}"))
            model.graph.node.append(helper.make_node(
                "Gather", [f"rope_{op}", self.POSITIONS_NAME], [f"rope_{op}_gathered"]))
            swap[node.output[0]] = f"rope_{op}_gathered"
        for node in model.graph.node:
            for i, tensor in enumerate(node.input):
                node.input[i] = swap.get(tensor, tensor)
        ONNXGraph(model).delete_orphaned_node_branches()  # the old position and mask branches
        return model


def stage(folder: Path, staged: Path) -> None:
    """A copy of the folder that transformers 4.40 and tokenizers 0.19 read."""
    staged.mkdir(parents=True)
    shutil.copy(folder / "config.json", staged)
    save_file(load_file(folder / "model.safetensors"), staged / "model.safetensors",
              metadata={"format": "pt"})
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    bpe = tokenizer["model"]
    bpe.pop("ignore_merges", None)
    bpe["merges"] = [m if isinstance(m, str) else " ".join(m) for m in bpe["merges"]]
    (staged / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    shutil.copy(folder / "tokenizer_config.json", staged)
    from transformers import AutoTokenizer  # writes special_tokens_map.json, which SparseML wants
    AutoTokenizer.from_pretrained(staged).save_pretrained(staged)


def main() -> None:
    folder, out = Path(sys.argv[1]), Path(sys.argv[2])
    work = out / "_work"
    stage(folder, work / "hf")
    LlamaInputs.rope = LlamaInputs.rope_tables(json.loads((folder / "config.json").read_text()))
    configs.LLAMA_CONFIG.additional_transforms = LlamaInputs
    from sparseml import export
    export(source_path=work / "hf", target_path=work / "export", task="text-generation",
           integration="transformers", config_args={"attn_implementation": "eager"},
           sequence_length=64)  # of the dummy input only (its default, the model's 4096, takes
    # 20 GB with eager attention); the ONNX keeps dynamic lengths, fixed by DeepSparse at compile
    for f in (work / "export" / "deployment").iterdir():
        if f.name != "model-orig.onnx":  # SparseML's copy from before the injection
            f.rename(out / f.name)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
