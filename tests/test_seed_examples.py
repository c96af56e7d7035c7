"""Every example of the DeepSparse and SparseML guides in ../shared/seeds, run as a user copies it
(issue 29): one test per example, the code as written with only these swaps:

- hub model names -> the default model (smollm2-135m-instruct, slow tests) or a tiny random
  Llama; `hf:org/name` -> the same kind of name, found in a local Hugging Face cache;
- `deepsparse` / `sparseml` imports -> `sparsellm`; `deepsparse.server` / `deepsparse.benchmark`
  -> `sparsellm serve` / `sparsellm benchmark` (which measures for 1 s here instead of 10);
- SparseAutoModelForCausalLM / SparseAutoTokenizer `.from_pretrained(model_id)` ->
  `load_checkpoint(model_id)` and its tokenizer;
- the Open-Platypus download -> local records of the same shape (instruction, output) in what
  `load_dataset` returns, {split: rows}; as the `datasets` package is not a dependency,
  `dataset.map(format_data)` is the same map written out.

Not run: the SparseML guide's PyTorch inference on CUDA (sparsellm runs the compressed model
with TextGeneration, the guide's DeepSparse section, tested below) and its hub upload.
"""

from __future__ import annotations

import inspect
import json
import shutil
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from seed_recipe import SEED_RECIPE
from server.conftest import ServerProcess, sse_events

DEFAULT_MODEL = "smollm2-135m-instruct"


# ---- fixtures: a tiny chat model, real servers, curl ---------------------------------------------
@pytest.fixture(scope="module")
def model_id(tmp_path_factory, tiny_tokenizer_dir, tiny_hf_tokenizer) -> str:
    """A tiny random Llama (chat template, 2048 positions: the guide exports 1024) as an HF
    folder: the stand-in for the guides' hub names."""
    import torch
    import transformers

    folder = tmp_path_factory.mktemp("tiny-chat")
    config = transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=2048, vocab_size=len(tiny_hf_tokenizer),
        bos_token_id=0, eos_token_id=2)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    for f in tiny_tokenizer_dir.iterdir():
        shutil.copy(f, folder / f.name)
    return str(folder)


@pytest.fixture(scope="module")
def start_server(tmp_path_factory) -> Iterator[Callable[[list[str]], ServerProcess]]:
    """start_server(args) -> a healthy `sparsellm serve ARGS` on a free port (stopped at the
    end of the module)."""
    started: list[ServerProcess] = []

    def start(args: list[str]) -> ServerProcess:
        server = ServerProcess(args, tmp_path_factory.mktemp("server") / "server.log")
        started.append(server)
        return server.wait_ready()

    yield start
    for s in started:
        s.stop()


def curl(url: str, *args: str) -> str:
    """`curl URL ARGS` (-X, -H, -d), as the guides write it; its output."""
    if shutil.which("curl"):
        return subprocess.run(["curl", "-sS", url, *args], capture_output=True, text=True,
                              check=True, timeout=120).stdout
    method, headers, data = "GET", {}, None  # no curl here: the same request with httpx
    for flag, value in zip(args[::2], args[1::2], strict=True):
        if flag == "-X":
            method = value
        elif flag == "-H":
            key, _, val = value.partition(":")
            headers[key.strip()] = val.strip()
        elif flag == "-d":
            method, data = ("POST" if method == "GET" else method), value
    return httpx.request(method, url, headers=headers, content=data, timeout=120).text


def localhost(url: str, server: ServerProcess) -> str:
    return url.replace("http://localhost:5543", server.url)


# ---- DeepSparse: Pipeline --------------------------------------------------------------------
@pytest.mark.slow
def test_pipeline_basic_usage(capsys):
    from sparsellm import Pipeline

    pipeline = Pipeline.create(
        task="text-generation",
        model_path=DEFAULT_MODEL)

    prompt = "def fibonacci(n):"
    output = pipeline(sequences=[prompt])

    print(f"{prompt}{output.sequences[0]}")

    printed = capsys.readouterr().out
    assert printed.startswith("def fibonacci(n):\n") and "return" in printed


@pytest.mark.slow
def test_pipeline_generation_settings(capsys):
    from sparsellm import Pipeline

    pipeline = Pipeline.create(
        task="text-generation",
        model_path=DEFAULT_MODEL,
        sequence_length=128,
        max_generated_tokens=64,
        force_max_tokens=True,
    )

    prompts = ["def fibonacci(n):"]
    output = pipeline(sequences=prompts)
    print(f"{prompts[0]}{output.sequences[0]}")

    assert capsys.readouterr().out.startswith("def fibonacci(n):")
    assert len(output.generations[0].token_ids) == 64
    assert output.generations[0].finished_reason == "length"


def test_pipeline_input_and_output_formats(model_id, capsys):
    from sparsellm import Pipeline

    pipeline = Pipeline.create(
        task="text-generation",
        model_path=model_id,
        max_generated_tokens=64,
    )

    output = pipeline(sequences="def fib()")  # one prompt: still a list of sequences
    print(output.__dict__.keys())
    print(type(output.sequences))
    print(len(output.sequences))
    print(type(output.logits))

    keys, kind, n, logits_kind = capsys.readouterr().out.splitlines()
    assert all(f"'{k}'" in keys for k in ("sequences", "logits", "session_id"))
    assert (kind, n, logits_kind) == ("<class 'list'>", "1", "<class 'NoneType'>")

    output = pipeline(sequences=["def fib()"]*5)
    print(len(output.sequences))

    assert capsys.readouterr().out == "5\n"

    output = pipeline(sequences=["def fib()"]*2, return_logits=True)
    print(output.logits.shape)

    tokens = len(pipeline.tokenizer.encode("def fib()")) + len(output.generations[0].token_ids)
    assert output.logits.shape == (2, tokens, pipeline.engine.vocab_size)
    assert capsys.readouterr().out == f"{output.logits.shape}\n"


def test_pipeline_streamer(model_id, capsys):
    from transformers import TextStreamer

    from sparsellm import Pipeline

    pipeline = Pipeline.create(
        task="text-generation",
        model_path=model_id,
        max_generated_tokens=64,
    )

    output = pipeline(sequences="fib(n):", streamer=TextStreamer(pipeline.tokenizer))

    printed = capsys.readouterr().out
    assert printed.startswith("fib(n):") and len(printed) > len("fib(n):")
    assert len(output.generations[0].token_ids) > 0


# ---- DeepSparse: Server ----------------------------------------------------------------------
def test_server_predict(model_id, start_server):
    # deepsparse.server --task text-generation --model_path MODEL
    server = start_server(["--task", "text-generation", "--model_path", model_id])

    out = curl(localhost("http://localhost:5543/predict", server), "-X", "POST",
               "-H", "Content-Type: application/json", "-d", '{"sequences": "def fib(n):"}')

    response = json.loads(out)
    assert isinstance(response["sequences"], list) and len(response["sequences"]) == 1
    assert isinstance(response["sequences"][0], str) and response["session_id"]


def test_server_config_file(model_id, start_server, tmp_path):
    config_yaml = textwrap.dedent(f"""\
        endpoints:
            - task: text-generation
              model: {model_id}
              route: /generate
              name: text-generation
              kwargs:
                sequence_length: 256
                max_generated_tokens: 32
                force_max_tokens: True
                deterministic: False
        """)
    (tmp_path / "config.yaml").write_text(config_yaml)
    # deepsparse.server --config-file config.yaml
    server = start_server(["--config-file", str(tmp_path / "config.yaml")])

    out = curl(localhost("http://localhost:5543/generate", server), "-X", "POST",
               "-H", "Content-Type: application/json", "-d", '{"sequences": "def fib(n):"}')

    response = json.loads(out)
    assert len(response["sequences"]) == 1
    assert response["generations"][0]["finished_reason"] == "length"  # force_max_tokens: 32
    assert yaml.safe_load(config_yaml)["endpoints"][0]["kwargs"]["max_generated_tokens"] == 32


# ---- SparseML: one-shot compression, evaluation, export ------------------------------------
def platypus_like_records() -> list[dict[str, str]]:
    """Open-Platypus's shape (instruction, output), from the standard library's functions."""
    import json as json_module
    import string

    return [{"instruction": f"Write the function {name} of the {mod.__name__} module.\n",
             "output": inspect.getsource(fn)}
            for mod in (textwrap, json_module.decoder, json_module.encoder, string, shutil)
            for name, fn in inspect.getmembers(mod, inspect.isfunction)
            if fn.__module__ == mod.__name__]


@pytest.fixture(scope="module")
def one_shot_example(model_id, tmp_path_factory) -> Path:
    """The guide's compression example, as written: the compressed model's folder."""
    from sparsellm import compress, load_checkpoint

    out = tmp_path_factory.mktemp("guide") / "one-shot-example"

    dataset = {"train": platypus_like_records()}  # load_dataset(...): a DatasetDict

    model = load_checkpoint(model_id)
    tokenizer = model.tokenizer

    def format_data(data):
        return {
            "text": data["instruction"] + data["output"]
        }

    dataset = {split: [{**data, **format_data(data)} for data in rows]  # dataset.map(...)
               for split, rows in dataset.items()}

    recipe = SEED_RECIPE  # the guide's recipe, verbatim (tests/seed_recipe.py)

    compress(
        model=model,
        tokenizer=tokenizer,
        dataset=dataset,
        recipe=recipe,
        output_dir=str(out),
    )
    return out


def test_datasets_by_split():
    from sparsellm.datasets import load_texts

    splits = {"train": [{"text": "a"}], "test": [{"text": "b"}]}
    assert load_texts(splits) == ["a"] and load_texts(splits, split="test") == ["b"]
    with pytest.raises(ValueError, match=r"split 'train' is not in the dataset; it has \['x'\]"):
        load_texts({"x": []})


def test_one_shot_compression(one_shot_example):
    from sparsellm import load_checkpoint

    ckpt = load_checkpoint(one_shot_example)
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    assert ckpt.weight_formats[q_proj].name == "sparse_int8_a8"
    assert (ckpt.tensors[q_proj] == 0).mean() >= 0.5
    assert ckpt.weight_formats["model.embed_tokens.weight"].name == "int8_asym"
    report = json.loads((one_shot_example / "compression_report.json").read_text())
    assert report["calibration"]["seq_len"] == 512 and report["notes"] == []


def test_compressed_model_chat(one_shot_example):
    # the guide's inference step, on sparsellm's runtime: chat template + generation
    from sparsellm import TextGeneration, load_checkpoint

    model_path = str(one_shot_example)
    tokenizer = load_checkpoint(model_path).tokenizer
    chat = [
        {"role": "user", "content": "What does pruning remove?"}
    ]
    inputs = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    outputs = TextGeneration(model_path, max_generated_tokens=16)(inputs).sequences
    assert inputs.endswith("<|im_start|>assistant\n") and len(outputs) == 1


def test_evaluate_perplexity(one_shot_example, capsys):
    from sparsellm import evaluate

    eval = evaluate(
        str(one_shot_example),
        datasets="openai_humaneval",
        integration="perplexity",
        text_column_name=["prompt", "canonical_solution"]
    )
    print(eval)

    assert eval.samples == 164 and np.isfinite(eval.perplexity) and eval.perplexity > 1
    assert capsys.readouterr().out.startswith(f"perplexity of {one_shot_example}")


@pytest.fixture(scope="module")
def exported(one_shot_example) -> Path:
    """The guide's export call, as written, from the folder the model was compressed to."""
    from sparsellm import export

    workdir = one_shot_example.parent
    export(
        str(one_shot_example),
        task="text-generation",
        sequence_length=1024,
        target_path=str(workdir / "exported")
    )
    return workdir / "exported" / "deployment"


def test_export(exported):
    deployment = json.loads((exported / "deployment.json").read_text())
    assert deployment["sequence_length"] == 1024 and (exported / "model.safetensors").is_file()


# ---- SparseML guide: deploy with DeepSparse (Pipeline, OpenAI server) ----------------------
def test_deploy_text_generation(exported, capsys):
    model_path = str(exported) + "/"

    text = ("A sparse model stores only its nonzero weights, so each generated token reads "
            "fewer bytes from memory; on a CPU that is most of the time a token takes.")
    prompt = f"""
In two sentences, say what this paragraph claims.

{text}
"""

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    chat = [
        {"role": "user", "content": prompt}
    ]
    formatted_prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True,
                                                     tokenize=False)
    print(formatted_prompt)

    from sparsellm import TextGeneration

    pipeline = TextGeneration(model_path)
    result = pipeline(formatted_prompt)

    print(result.generations[0].text)

    assert capsys.readouterr().out.startswith("<|im_start|>user\n\nIn two sentences")
    assert pipeline.sequence_length == 1024  # the exported deployment's
    assert result.generations[0].finished_reason in ("stop", "length")


def test_openai_integration(exported, start_server, tmp_path, monkeypatch):
    import requests

    openai = pytest.importorskip("openai")

    # the exported folder, as `huggingface-cli download` leaves it in the local cache
    name = "sparsellm-tests/tiny-chat-pruned50-quant-ds"
    snapshot = tmp_path / "hub" / f"models--{name.replace('/', '--')}" / "snapshots" / "0"
    shutil.copytree(exported, snapshot)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))

    # deepsparse.server --integration openai "hf:sparsellm-tests/tiny-chat-pruned50-quant-ds"
    server = start_server(["--integration", "openai", f"hf:{name}"])

    url = localhost("http://localhost:5543/v1/chat/completions", server)
    headers = {"Content-Type": "application/json"}
    data = {
        "model": f"hf:{name}",
        "messages": "Sparse models are",
        "stream": True
    }

    response = requests.post(url, headers=headers, data=json.dumps(data))

    chunks = []
    if response.status_code == 200:
        for chunk in response.iter_content(chunk_size=128):
            chunks.append(chunk.decode('utf-8'))
    else:
        print("Request failed with status code:", response.status_code)

    events = list(sse_events("".join(chunks).splitlines()))
    assert events[-1] == "[DONE]" and events[0]["model"] == f"hf:{name}"
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length")

    out = curl(localhost("http://localhost:5543/v1/chat/completions", server),
               "-H", "Content-Type: application/json",
               "-d", f'{{"model": "hf:{name}", "prompt": "Name a prime", "stream": true}}')
    events = list(sse_events(out.splitlines()))
    assert events[-1] == "[DONE]" and events[0]["choices"][0]["delta"]["role"] == "assistant"

    # the same with the openai client; /predict is not served with --integration openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == [f"hf:{name}"]
    stream = client.chat.completions.create(
        model=f"hf:{name}", messages=[{"role": "user", "content": "Sparse models are"}],
        stream=True, max_tokens=8, temperature=0)
    assert [c.choices[0].finish_reason for c in stream][-1] in ("stop", "length")
    assert httpx.post(server.url + "/predict", json={"sequences": "x"}).status_code == 404


# ---- DeepSparse: Benchmark -------------------------------------------------------------------
@pytest.mark.parametrize("which", ["dense", "pruned50-quant"])
def test_benchmark(which, model_id, one_shot_example, capsys):
    from sparsellm.cli import main

    model = model_id if which == "dense" else str(one_shot_example)
    # deepsparse.benchmark MODEL (measured for 1 s instead of the default 10)
    assert main(["benchmark", model, "--time", "1", "--warmup-time", "0.2"]) == 0

    report = dict(line.split(" : ", 1) for line in capsys.readouterr().out.splitlines())
    report = {k.strip(): v.strip() for k, v in report.items()}
    assert report["Original Model Path"] == model
    assert (report["Batch Size"], report["Scenario"]) == ("1", "sync")
    assert float(report["Throughput (items/sec)"]) > 0
    assert float(report["Latency Mean (ms/token)"]) > 0
