"""Offload that fits (engine/offload.py): llama.cpp's accounting of a no_alloc load on the CPU device,
the fitting rule on fake GPU lists, and ``auto`` on this machine (no GPU: nothing offloaded, nothing
sized)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from edgespec.engine import offload
from edgespec.engine.gguf_header import read_header
from edgespec.engine.offload import MARGIN, Device, Footprint, MiB, fit_layers
from edgespec.engine.pair import EngineSettings, ModelPair
from edgespec.session import where_text

GiB = 1024 * MiB


def gpu(free_gib: float, description: str = "Fake GPU") -> Device:
    return Device("FAKE0", description, int(free_gib * GiB), int(free_gib * GiB))


# -- llama.cpp's accounting on the CPU device ----------------------------------------------------
def test_a_no_alloc_load_gives_llama_cpps_bytes_for_weights_kv_and_compute(tiny_gguf):
    meta, _ = read_header(tiny_gguf)
    arch = meta["general.architecture"]
    n_layer, n_embd = meta[f"{arch}.block_count"], meta[f"{arch}.embedding_length"]
    n_head, n_head_kv = meta[f"{arch}.attention.head_count"], meta[f"{arch}.attention.head_count_kv"]
    sized = offload.footprint(tiny_gguf, n_ctx=1024, n_batch=512, n_seq_max=65, flash_attn=False)
    assert sized.units == n_layer + 1  # the repeating layers and the output layer
    # the weights are the file less its header (metadata, tokenizer): most of this tiny file
    assert 0.5 * os.path.getsize(tiny_gguf) < sized.weights < os.path.getsize(tiny_gguf)
    # KV: K and V, f16, one row of n_head_kv·head_dim per cell per layer
    assert sized.kv == 2 * 2 * 1024 * n_layer * n_head_kv * (n_embd // n_head)
    assert sized.compute > 0
    longer = offload.footprint(tiny_gguf, n_ctx=2048, n_batch=512, n_seq_max=65, flash_attn=False)
    assert longer.kv == 2 * sized.kv and longer.weights == sized.weights


def test_a_log_without_the_sizes_is_refused_with_the_flags_to_give():
    assert offload.logged_buffers(
        "llama_kv_cache: size =    1.00 MiB (  4096 cells,   2 layers,  1/1 seqs)\n"
        "sched_reserve:      CUDA0 compute buffer size =   300.50 MiB\n"
        "sched_reserve:  CUDA_Host compute buffer size =     2.00 MiB\n"
    ) == (1 * MiB, round(302.5 * MiB))
    with pytest.raises(Exception, match="--target-gpu-layers"):
        offload.logged_buffers("nothing about buffers")


# -- the fitting rule ---------------------------------------------------------------------------
# a 1.5B-like target (29 units: 28 layers + output) and a 0.5B-like draft (25 units), bytes rounded
TARGET = Footprint(units=29, weights=1060 * MiB, kv=112 * MiB, compute=300 * MiB)
DRAFT = Footprint(units=25, weights=380 * MiB, kv=48 * MiB, compute=300 * MiB)


def test_everything_fits_on_a_large_gpu():
    assert fit_layers([gpu(80)], TARGET, DRAFT) == (-1, -1)


def test_the_draft_goes_whole_first_then_as_many_target_layers_as_fit():
    free = MARGIN + DRAFT.need(DRAFT.units) + TARGET.need(10)
    target, draft = fit_layers([Device("FAKE0", "Fake GPU", free, free)], TARGET, DRAFT)
    assert draft == -1 and target == 10
    # one byte less and the tenth target layer does not fit
    target, _ = fit_layers([Device("FAKE0", "Fake GPU", free - 1, free)], TARGET, DRAFT)
    assert target == 9


def test_a_gpu_too_small_for_the_whole_draft_takes_part_of_it_and_no_target():
    free = MARGIN + DRAFT.need(5)
    assert fit_layers([Device("FAKE0", "Fake GPU", free, free)], TARGET, DRAFT) == (0, 5)
    assert fit_layers([Device("FAKE0", "Fake GPU", free - 1, free)], TARGET, DRAFT) == (0, 4)


def test_nothing_fits_below_the_margin_and_the_buffers():
    assert fit_layers([gpu(1.0)], TARGET, DRAFT) == (0, 0)  # all of it is the margin
    assert fit_layers([gpu(1.2)], TARGET, DRAFT) == (0, 0)  # 200 MiB: less than a compute buffer
    assert fit_layers([], TARGET, DRAFT) == (0, 0)  # no GPU


def test_without_a_draft_the_target_has_the_gpu():
    free = MARGIN + TARGET.need(TARGET.units)
    assert fit_layers([Device("FAKE0", "Fake GPU", free, free)], TARGET, None) == (-1, 0)
    assert fit_layers([Device("FAKE0", "Fake GPU", free - 1, free)], TARGET, None)[0] == 28


def test_free_memory_adds_up_over_gpus_less_a_margin_each():
    free = MARGIN + (DRAFT.need(DRAFT.units) + TARGET.need(TARGET.units)) // 2 + 1
    two = [Device(f"FAKE{i}", "Fake GPU", free, free) for i in range(2)]
    assert fit_layers(two, TARGET, DRAFT) == (-1, -1)
    assert fit_layers(two[:1], TARGET, DRAFT)[0] != -1


def test_a_number_asked_is_kept_and_its_memory_counted_first():
    # the target asked whole: the draft gets what is left, not the GPU first
    free = MARGIN + TARGET.need(TARGET.units) + DRAFT.need(3)
    assert fit_layers([Device("FAKE0", "Fake GPU", free, free)], TARGET, DRAFT, (-1, "auto")) == (-1, 3)
    assert fit_layers([gpu(80)], TARGET, DRAFT, ("auto", 0)) == (-1, 0)
    assert fit_layers([gpu(80)], TARGET, DRAFT, (4, "auto")) == (4, -1)


def test_a_partial_offload_is_never_under_counted():
    # spreading the output layer's bytes over every unit over-counts any partial offload: the output
    # layer (vocab × embd) is the largest unit and goes last
    for layers in range(1, TARGET.units):
        assert TARGET.need(layers) >= TARGET.compute + layers * (TARGET.weights + TARGET.kv) // TARGET.units
        assert TARGET.most(TARGET.need(layers)) == layers


# -- auto on this machine, and the reports --------------------------------------------------------
def test_auto_on_a_machine_without_a_gpu_is_the_cpu_and_sizes_nothing(tiny_gguf, monkeypatch):
    if offload.gpu_devices():
        pytest.skip("this machine has a GPU")

    def no_sizing(*args, **kwargs):
        raise AssertionError("auto without a GPU must not load anything to size it")

    monkeypatch.setattr("edgespec.engine.pair.footprint", no_sizing)
    with ModelPair(tiny_gguf, tiny_gguf) as pair:
        assert pair.requested.target_gpu_layers == pair.requested.draft_gpu_layers == "auto"
        assert (pair.settings.target_gpu_layers, pair.settings.draft_gpu_layers) == (0, 0)
        where = pair.runs_on_json()
    assert where == {
        "target": {"device": "CPU", "gpu_layers": 0, "layers": 3},
        "draft": {"device": "CPU", "gpu_layers": 0, "layers": 3},
    }
    assert where_text(where) == "CPU"


def test_auto_with_a_gpu_fits_by_the_accounting_and_reports_the_gpu(tiny_gguf, monkeypatch):
    monkeypatch.setattr("edgespec.engine.pair.gpu_devices", lambda: [gpu(8, "Fake H200")])
    with ModelPair(tiny_gguf, tiny_gguf) as pair:  # a CPU build ignores the layers; the counts stay
        assert (pair.settings.target_gpu_layers, pair.settings.draft_gpu_layers) == (-1, -1)
        where = pair.runs_on_json()
    assert where["target"] == {"device": "Fake H200", "gpu_layers": 3, "layers": 3}
    assert where_text(where) == "target: Fake H200 3/3 · draft: Fake H200 3/3"
    monkeypatch.setattr("edgespec.engine.pair.gpu_devices", lambda: [gpu(1, "Fake small")])
    with ModelPair(tiny_gguf, None) as pair:  # 1 GiB free is all margin
        assert pair.settings.target_gpu_layers == 0 and pair.runs_on_json()["target"]["device"] == "CPU"


def test_auto_with_rpc_servers_leaves_the_placement_to_them():
    me = SimpleNamespace(_devices=[gpu(80)])
    settings = ModelPair._fit(me, EngineSettings(rpc=("127.0.0.1:9",)), "/no/target.gguf", "/no/draft.gguf")
    assert (settings.target_gpu_layers, settings.draft_gpu_layers) == (0, 0)  # nothing was loaded to size
    asked = ModelPair._fit(me, EngineSettings(rpc=("127.0.0.1:9",), target_gpu_layers=-1), "/no/t", "/no/d")
    assert (asked.target_gpu_layers, asked.draft_gpu_layers) == (-1, 0)


def test_where_text_names_the_models_off_the_cpu():
    rpc = {"device": "RPC 10.0.0.2:50052 + this machine (CPU)", "gpu_layers": 0, "layers": 29}
    cpu = {"device": "CPU", "gpu_layers": 0, "layers": 25}
    assert where_text({"target": rpc, "draft": cpu}) == f"target: {rpc['device']}"
