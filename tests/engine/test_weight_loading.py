"""Loading at real sizes (issue 32): bf16 stays bf16 (no fp32 copy, views of the mapped file),
the mapped pages are shared between processes, converted weights are cached and the cache
notices a changed source, and a model that cannot fit is a clear error before anything is
packed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from bf16_models import write_bf16_model
from sparsellm.dtypes import BFLOAT16
from sparsellm.engine import Engine, ModelTooLargeError, memory_check
from sparsellm.engine.weight_cache import WeightCache
from sparsellm.models import load_checkpoint


def _logits(engine: Engine, ids: list[int]) -> np.ndarray:
    seq = engine.add_sequence()
    out = engine.prefill(seq, ids, all_logits=True)
    engine.release(seq)
    return out


def _anonymous_bytes() -> int:
    """Private anonymous memory of this process (not file pages: a mapped file is not in it)."""
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no Anonymous line in smaps_rollup")


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory, tiny_tokenizer_dir) -> Path:
    return write_bf16_model(tmp_path_factory.mktemp("bf16") / "m", tiny_tokenizer_dir,
                            shards=3)


def test_bf16_checkpoint_runs_bf16_from_the_mapped_file(bf16_model, token_ids):
    ck = load_checkpoint(bf16_model)
    before = _anonymous_bytes()
    engine = Engine(ck, sequence_length=64, weights_cache=False)
    grown = _anonymous_bytes() - before
    assert set(engine.formats.values()) == {"bf16"}
    for name, packed in engine.model.packed.items():  # no copy: the file's own bytes
        data = packed.arrays["data"]
        assert not data.flags.writeable and np.shares_memory(data, ck.stored[name]), name
    # Neither an fp32 nor a bf16 private copy of the weights (the fp32 one would be 4x this).
    bf16_bytes = engine.weight_bytes_per_step
    assert grown < 0.25 * bf16_bytes, (grown, bf16_bytes)
    # ... and the logits are those of the same weights widened to fp32.
    ids = token_ids(20, seed=3)
    fp32 = Engine(ck, sequence_length=64, weights="fp32", weights_cache=False)
    np.testing.assert_allclose(_logits(engine, ids), _logits(fp32, ids), rtol=0, atol=2e-4)


def test_sharded_checkpoint_reads_every_shard(bf16_model):
    ck = load_checkpoint(bf16_model)
    assert len(ck.source_files) == 3
    assert {ck.stored_dtype(n) for n in ck.stored} == {BFLOAT16}
    assert all(ck.stored[n].dtype == BFLOAT16 and ck.tensors[n].dtype == np.float32
               for n in ck.stored)


def test_mapped_weights_are_shared_between_processes(bf16_model):
    """A second process loading the same model maps the same page-cache pages: while another
    process holds them, this one's weight pages are shared, not private copies."""
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from sparsellm.engine import Engine
            e = Engine({str(bf16_model)!r}, sequence_length=32, weights_cache=False)
            s = e.add_sequence(); e.prefill(s, [1, 2, 3])  # touches every weight page
            print("ready", flush=True)
            sys.stdin.readline()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        engine = Engine(bf16_model, sequence_length=32, weights_cache=False)
        _logits(engine, [1, 2, 3])
        rollup = dict(line.split(":", 1) for line in
                      Path("/proc/self/smaps_rollup").read_text().splitlines()[1:])
        shared = int(rollup["Shared_Clean"].split()[0]) * 1024
        assert shared > 0.9 * engine.weight_bytes_per_step, (shared, engine.weight_bytes_per_step)
    finally:
        holder.communicate("\n", timeout=30)


def test_converted_weights_are_cached_and_mapped_next_time(bf16_model, tmp_path, token_ids):
    ids = token_ids(20, seed=4)
    first = Engine(bf16_model, sequence_length=64, weights="int8_a8", weights_cache=tmp_path)
    entries = list(tmp_path.glob("*.weights"))
    assert len(entries) == 1
    second = Engine(bf16_model, sequence_length=64, weights="int8_a8", weights_cache=tmp_path)
    for name, packed in second.model.packed.items():  # views of the cache file, not packed
        assert not packed.arrays["data"].flags.writeable, name
        for key, a in packed.arrays.items():
            np.testing.assert_array_equal(a, first.model.packed[name].arrays[key])
    np.testing.assert_array_equal(_logits(first, ids), _logits(second, ids))
    # Another format is another entry; the bf16 model (nothing converted) writes none.
    Engine(bf16_model, sequence_length=64, weights="int4_g32", weights_cache=tmp_path)
    Engine(bf16_model, sequence_length=64, weights_cache=tmp_path)
    assert len(list(tmp_path.glob("*.weights"))) == 2


def test_cache_entry_of_a_changed_source_is_rebuilt(tiny_tokenizer_dir, tmp_path, token_ids):
    model = write_bf16_model(tmp_path / "m", tiny_tokenizer_dir, layers=2, seed=1)
    cache = tmp_path / "cache"
    ids = token_ids(12, seed=5)
    old = _logits(Engine(model, sequence_length=32, weights="int8_a8", weights_cache=cache), ids)
    write_bf16_model(model, tiny_tokenizer_dir, layers=2, seed=2)  # new weights, same files
    fresh = _logits(Engine(model, sequence_length=32, weights="int8_a8", weights_cache=False),
                    ids)
    again = _logits(Engine(model, sequence_length=32, weights="int8_a8", weights_cache=cache), ids)
    assert np.abs(old - fresh).max() > 0.1  # the comparison is not vacuous
    np.testing.assert_array_equal(again, fresh)
    assert len(list(cache.glob("*.weights"))) == 1  # replaced, not accumulated


def test_truncated_cache_entry_is_ignored_and_rewritten(bf16_model, tmp_path, token_ids, caplog):
    ids = token_ids(12, seed=6)
    ref = _logits(Engine(bf16_model, sequence_length=32, weights="int8", weights_cache=tmp_path),
                  ids)
    (entry,) = tmp_path.glob("*.weights")
    entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
    out = _logits(Engine(bf16_model, sequence_length=32, weights="int8", weights_cache=tmp_path),
                  ids)
    np.testing.assert_array_equal(out, ref)
    assert "ignoring unreadable weights cache entry" in caplog.text
    assert WeightCache(tmp_path, load_checkpoint(bf16_model).source_files,
                       Engine(bf16_model, weights="int8", weights_cache=False).specs
                       ).load() is not None  # rewritten whole


def test_cache_keeps_within_its_limit_evicting_the_least_recently_used(
        bf16_model, tmp_path, monkeypatch, token_ids):
    ids = token_ids(12, seed=7)

    def load(fmt):
        return _logits(Engine(bf16_model, sequence_length=32, weights=fmt,
                              weights_cache=tmp_path), ids)

    load("int8")
    load("int8_a8")
    entries = {f.name: f.stat().st_size for f in tmp_path.glob("*.weights")}
    assert len(entries) == 2
    os.utime(tmp_path / min(entries), (0, 0))  # both used long ago ...
    os.utime(tmp_path / max(entries), (0, 0))
    int8 = load("int8")  # ... then int8 again: int8_a8 is now the least recently used
    (recent,) = [n for n in entries if (tmp_path / n).stat().st_mtime > 0]
    orphan, fresh = tmp_path / ".killed.weights.1.tmp", tmp_path / ".writing.weights.2.tmp"
    orphan.write_bytes(b"x" * 100)
    fresh.write_bytes(b"x" * 100)
    os.utime(orphan, (0, 0))
    # room for two entries: the third evicts the least recently used one
    monkeypatch.setenv("SPARSELLM_CACHE_MAX_GB", str(2.5 * max(entries.values()) / 1e9))
    load("int4_g32")
    left = {f.name for f in tmp_path.glob("*.weights")}
    assert len(left) == 2 and recent in left and left - set(entries)
    assert not orphan.exists() and fresh.exists()  # a killed write's temp file goes
    np.testing.assert_array_equal(load("int8"), int8)  # served from its entry


def test_entry_over_the_cache_limit_is_not_written(bf16_model, tmp_path, monkeypatch, caplog):
    Engine(bf16_model, sequence_length=32, weights="int8", weights_cache=tmp_path)
    (kept,) = tmp_path.glob("*.weights")
    monkeypatch.setenv("SPARSELLM_CACHE_MAX_GB", str(kept.stat().st_size / 2 / 1e9))
    Engine(bf16_model, sequence_length=32, weights="int8_a8", weights_cache=tmp_path)
    assert list(tmp_path.glob("*.weights")) == [kept]  # nothing written, nothing evicted
    assert "not caching converted weights" in caplog.text
    assert "SPARSELLM_CACHE_MAX_GB" in caplog.text


@pytest.mark.parametrize("value", ["lots", "-1", "nan"])
def test_malformed_cache_limit_is_a_clear_error(bf16_model, tmp_path, monkeypatch, value):
    monkeypatch.setenv("SPARSELLM_CACHE_MAX_GB", value)
    with pytest.raises(ValueError, match=rf"^SPARSELLM_CACHE_MAX_GB='{value}': expected a size "
                       r"in GB"):
        Engine(bf16_model, sequence_length=32, weights="int8", weights_cache=tmp_path)


def test_disk_filling_during_the_cache_write_still_loads(bf16_model, tmp_path, monkeypatch,
                                                         caplog, token_ids):
    """The disk fills while the entry is written (after the free-space check passed): the
    engine loads anyway, with a warning, and leaves no partial entry or temp file."""
    import errno

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    ids = token_ids(12, seed=8)
    monkeypatch.setattr("sparsellm.engine.weight_cache.os.fsync", full)
    out = _logits(Engine(bf16_model, sequence_length=32, weights="int8", weights_cache=tmp_path),
                  ids)
    assert not list(tmp_path.iterdir())
    assert "ran out of space" in caplog.text
    np.testing.assert_array_equal(
        out, _logits(Engine(bf16_model, sequence_length=32, weights="int8",
                            weights_cache=False), ids))


def test_in_memory_weights_are_never_cached(bf16_model, tmp_path):
    ck = load_checkpoint(bf16_model)
    edited = ck.with_tensors({n: t * 0.5 if t.ndim == 2 else t for n, t in ck.tensors.items()})
    Engine(edited, sequence_length=32, weights="int8_a8", weights_cache=tmp_path)
    assert not list(tmp_path.iterdir())


def test_cache_off_writes_nothing(bf16_model, tmp_path, weights_cache_dir):
    before = set(weights_cache_dir.iterdir())
    Engine(bf16_model, sequence_length=32, weights="int8_a8", weights_cache=False)
    assert set(weights_cache_dir.iterdir()) == before


def test_model_too_large_is_a_clear_error_before_packing(bf16_model, monkeypatch):
    ck = load_checkpoint(bf16_model)
    need = Engine(ck, sequence_length=64, weights_cache=False).weight_bytes_per_step
    monkeypatch.setattr(memory_check, "available_memory", lambda: need // 2)
    packed = []
    monkeypatch.setattr("sparsellm.engine.native_model.pack",
                        lambda *a, **k: packed.append(1))  # must not be reached
    with pytest.raises(ModelTooLargeError, match=rf"^{bf16_model}: this model needs about "
                       r"[\d.]+ GB of memory .* as bf16, .* Use a smaller weight format "
                       r"\(weights='int8_a8' \([\d.]+ GB\)"):
        Engine(ck, sequence_length=64, weights_cache=False)
    assert not packed


def test_resident_estimate_matches_what_is_packed(bf16_model):
    ck = load_checkpoint(bf16_model)
    for fmt in (None, "int8_a8", "int4_g32", "fp32"):
        engine = Engine(ck, sequence_length=32, weights=fmt, weights_cache=False)
        embed = ck.args.vocab_size * ck.args.hidden_size * 2  # the bf16 table, as stored
        norms = 8 * ck.args.num_hidden_layers * ck.args.hidden_size * 4
        assert memory_check.resident_weight_bytes(ck, engine.specs) == \
            engine.weight_bytes_per_step + embed + norms, fmt


def test_resident_estimate_of_a_pruned_model_counts_its_zeros(bf16_model, tmp_path):
    """A sparse format's estimate reads a block of rows of each weight: a 50%-pruned model in
    sparse_fp32 is estimated near what is packed, not at the dense upper bound (which refused a
    50%-sparse 7B model that fits: 27.9 GB estimated for 15.5 GB)."""
    import shutil

    from sparsellm.models.safetensors_io import read_safetensors, write_safetensors

    pruned = tmp_path / "pruned"
    shutil.copytree(bf16_model, pruned)
    rng = np.random.default_rng(0)
    for f in pruned.glob("*.safetensors"):
        tensors = read_safetensors(f)
        for n, w in tensors.items():
            if n.endswith("_proj.weight"):
                tensors[n] = np.where(rng.random(w.shape) < 0.5, w, 0).astype(w.dtype)
        write_safetensors(f, tensors)
    ck = load_checkpoint(pruned)
    engine = Engine(ck, sequence_length=32, weights="sparse_fp32", weights_cache=False)
    embed = ck.args.vocab_size * ck.args.hidden_size * 2
    norms = 8 * ck.args.num_hidden_layers * ck.args.hidden_size * 4
    packed = engine.weight_bytes_per_step + embed + norms
    estimate = memory_check.resident_weight_bytes(ck, engine.specs)
    dense = memory_check.resident_weight_bytes(load_checkpoint(bf16_model), engine.specs)
    assert packed <= estimate < 1.1 * packed and estimate < 0.8 * dense, (packed, estimate, dense)


def test_stale_layout_version_invalidates(bf16_model, tmp_path, monkeypatch):
    Engine(bf16_model, sequence_length=32, weights="int8", weights_cache=tmp_path)
    ck = load_checkpoint(bf16_model)
    formats = Engine(ck, weights="int8", weights_cache=False).specs
    assert WeightCache(tmp_path, ck.source_files, formats).load() is not None
    monkeypatch.setattr("sparsellm.engine.weight_cache.LAYOUT_VERSION", -1)
    assert WeightCache(tmp_path, ck.source_files, formats).load() is None


def test_weights_cache_dir_follows_the_environment(weights_cache_dir):
    from sparsellm.cache_dir import default_cache_dir

    assert default_cache_dir() == weights_cache_dir == Path(os.environ["SPARSELLM_CACHE_DIR"])
