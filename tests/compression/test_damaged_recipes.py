"""Damaged recipe files, systematically (issue 55 item 2): the seed guide's SparseML recipe and
every example recipe (examples/recipes/) cut short, bit-flipped (text that may no longer be
UTF-8 or YAML), and edited node by node: any YAML value, values near the valid ones for the
keys recipes use (sparsities, N:M structures, bits, group sizes, strategies, schemes, targets
that match nothing or are not regular expressions), keys deleted or renamed to any YAML key.
Every case parses and plans on a tiny model's weights, or is refused with the project's own
ValueError (RecipeError) naming the file; never another exception or a hang.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, note, settings
from hypothesis import strategies as st

from file_damage import (
    SETTINGS,
    EditDocument,
    Outcomes,
    bit_flips,
    document_edits,
    json_values,
    paths_in,
    replace_file,
    scaled,
    truncations,
)
from seed_recipe import SEED_RECIPE
from sparsellm.compression.plan import weight_modules
from sparsellm.compression.recipe import build_plan, parse_recipe

pytestmark = pytest.mark.slow  # about half a minute on 2 cores

CASES = scaled(1000)
EXAMPLES = Path(__file__).parents[2] / "examples" / "recipes"
RECIPES = {"seed": SEED_RECIPE.encode(),
           **{p.name: p.read_bytes() for p in sorted(EXAMPLES.glob("*.yaml"))}}
MODULES = weight_modules(["lm_head.weight"], 2)

NEAR_VALID = {
    "sparsity": [-0.1, 0, 0.5, 0.99, 1, 1.5, float("nan"), float("inf"), "0.5", None, True],
    "mask_structure": ["0:0", "2:4", "4:2", "2:0", "0:4", "x:y", "2:4:8", ":", "unstructured",
                       24, None],
    "block_size": [0, -1, 1, 128, 2**63, 1.5, None, "128"],
    "dampening_frac": [-1, 0, 0.01, float("nan"), None],
    "percdamp": [-1, 0, 0.01, None],
    "num_bits": [0, 1, 2, 4, 8, 16, -8, None, "8", 8.5],
    "group_size": [None, 0, 1, -1, 7, 128, 2**40, "128", 1.5],
    "strategy": ["group", "channel", "tensor", "token", "block", None, 3],
    "symmetric": [True, False, None, "no", 2],
    "type": ["int", "float", None],
    "scheme": ["W8A8", "W4A16", "w4a16", "X", {"W8A8": ["Linear"]}, {"W8A8": "Linear"},
               {"X": []}, None, 3, []],
    "targets": [[], ["Linear"], ["Embedding"], ["re:("], ["re:.*"], ["re:nothing"], "Linear",
                None, [None], [3], [["Linear"]], "lm_head", ["LlamaDecoderLayer"], ["Attention"]],
    "ignore": [[], ["re:("], ["lm_head"], "lm_head", None, [3], ["re:.*"]],
    "run_type": ["oneshot", "training", None, 1],
    "quantize": [True, False, {}, None, "yes"],
    "input_activations": [None, {}, {"num_bits": 4}, {"num_bits": 8, "strategy": "tensor"}, 8],
    "weights": [None, {}, {"num_bits": 4}, {"num_bits": 4, "strategy": "group"}, []],
    "config_groups": [{}, None, [], {"g": None}, {"g": {}}, {"g": {"targets": ["Linear"]}}],
    "scheme_overrides": [{}, None, [], {"Linear": None}, {"Linear": {"weights": None}}],
}
keys = st.one_of(st.text(max_size=10), st.integers(-2, 2), st.booleans(), st.none(),
                 st.sampled_from(["SparseGPTModifier", "GPTQModifier", "QuantizationModifier",
                                  "oneshot_modifiers", "stage", "version", "sparsity"]))


def edits(doc: object) -> st.SearchStrategy[EditDocument]:
    paths = paths_in(doc)
    near = [p for p in paths if isinstance(p[-1], str) and p[-1] in NEAR_VALID]
    return st.one_of(
        st.sampled_from(near).flatmap(lambda p: st.sampled_from(NEAR_VALID[p[-1]]).map(
            lambda v: EditDocument(p, v))),
        document_edits(doc, json_values, keys))


class EditYAML:
    def __init__(self, edit: EditDocument):
        self.edit = edit

    def __repr__(self) -> str:
        return f"EditYAML({self.edit!r})"

    def apply(self, text: bytes) -> bytes:
        return yaml.safe_dump(self.edit.apply(yaml.safe_load(text)), sort_keys=False).encode()


def damage(text: bytes) -> st.SearchStrategy[object]:
    return st.one_of(truncations(len(text)), bit_flips(len(text), len(text)),
                     edits(yaml.safe_load(text)).map(EditYAML),
                     edits(yaml.safe_load(text)).map(EditYAML))


def test_damaged_recipe_is_planned_or_refused_by_name(tmp_path):
    outcomes = Outcomes()
    path = tmp_path / "recipe.yaml"

    def parse_and_plan() -> None:
        build_plan(parse_recipe(path), MODULES)
        build_plan(parse_recipe(path), weight_modules([], 2), tied_embeddings=True)

    @settings(SETTINGS, max_examples=CASES)
    @given(st.sampled_from(sorted(RECIPES)).flatmap(
        lambda name: st.tuples(st.just(name), damage(RECIPES[name]))))
    def case(recipe_and_change):
        name, change = recipe_and_change
        note(f"damage to {name}: {change!r}")
        replace_file(path, change.apply(RECIPES[name]))
        outcomes.check(parse_and_plan, path)

    case()
    print(outcomes.summary("damaged recipes"))
    assert outcomes.cases >= CASES
    assert outcomes.counts["refused"] > CASES // 4
