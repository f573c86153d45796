"""Loading a target/draft pair and checking that they can speculate for each other."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import EngineError, PairingError
from ..planner.inputs import DraftSetup
from ..planner.tree import DraftTree
from ._backend import amx_guard, system_info
from ._context import LLAMA_MAX_SEQ, Context, ContextSettings
from ._lora import LoraAdapter
from ._model import Model
from .draft import Draft, look_ahead_during
from .offload import AUTO, GpuLayers, RunsOn, fit_layers, footprint, gpu_devices, runs_on
from .parallel import ParallelDrafter, check_base, read_adapter, untrained
from .ports import Pending
from .rpc import Placement
from .runners import CachedModel, Target
from .samplers import reductions_from_env


@dataclass(frozen=True)
class EngineSettings:
    n_ctx: int = 4096  # context window of both models
    # layers offloaded to the GPU (GPU builds only): a count, -1 = all, auto = what fits (offload.py);
    # a loaded ModelPair's settings hold the counts auto became
    target_gpu_layers: GpuLayers = AUTO
    draft_gpu_layers: GpuLayers = AUTO
    threads: int = 0  # 0 → every core
    max_tree_nodes: int = 64  # largest draft tree (root excluded) a step may verify
    repack: bool = True  # llama.cpp's CPU weight repacking (faster; batch numerics differ from B=1)
    draft_top_k: int = 32  # candidates kept per draft distribution
    probe_dir: Path | None = None  # where passed backend probes are remembered (None: probe every load)
    flash_attn: bool | None = None  # None: off where a model has no layer on a GPU, else llama.cpp's choice
    # where both models' output rows are reduced (samplers.resolve): "auto" → backend with GPU layers
    reductions: str = field(default_factory=reductions_from_env)

    # llama.cpp RPC servers (HOST:PORT) holding the target's layers with this machine (engine/rpc.py);
    # None: not given (a pair's models.toml entry may name some), (): this machine only
    rpc: tuple[str, ...] | None = None
    tensor_split: tuple[float, ...] = ()  # the target's share per device (RPC ones, then here); (): by memory
    rpc_timeout: float = 120.0  # seconds a call over RPC may take before its server counts as lost

    @property
    def target_on_cpu(self) -> bool:
        """No target layer on a GPU here (RPC servers are taken to be CPUs, as measured: a local and a
        split target then decode with the same kernels, token for token)."""
        return self.target_gpu_layers == 0

    def context(self, cpu_only: bool = True, reductions: str = "numpy") -> ContextSettings:
        """A model's context; ``cpu_only``: no layer on a GPU here.

        Flash attention is off on a CPU: its kernel takes each query row alone against the whole cache,
        where the unfused path multiplies a tree's rows as one matrix. On the 2-core EPYC at a 2,000-token
        context verifying 16 tokens took 409-470 ms off vs 520-551 on (32: 727-813 vs 990-1002 ms; one
        token and 128-400-token prefills within a few %, off the slower), and the served 6-turn
        conversation 80.2, 84.2 s vs 88.7, 91.9 s. Off holds an n_batch × n_ctx score buffer per head
        (the 1.5B's compute buffer at 32,768 tokens: 848 MiB off, 97 MiB on; ``--flash-attn on`` where
        memory is short); GPU offload keeps llama.cpp's choice. ``flash_attn`` set: that, everywhere.
        ``reductions``: where rows are reduced (``samplers.resolve``; auto on a CPU: numpy)."""
        return ContextSettings(
            n_ctx=self.n_ctx,
            n_batch=max(512, self.max_tree_nodes + 1),
            n_seq_max=min(LLAMA_MAX_SEQ, self.max_tree_nodes + 1),
            n_threads=self.threads,
            flash_attn=self.flash_attn if self.flash_attn is not None else (False if cpu_only else None),
            reductions="numpy" if reductions == "auto" and cpu_only else reductions,
        )


class ModelPair:
    """The target (always) and the draft (unless decoding plainly). Owns both; use as a context manager."""

    def __init__(
        self,
        target_path: str,
        draft_path: str | None,
        settings: EngineSettings | None = None,
        draft_sha256: str | None = None,
    ):
        """``draft_sha256``: the draft file's hash when the loader knows it (the model store's record of
        this exact file): a trained parallel drafter is checked against it without hashing the file."""
        self.requested = settings or EngineSettings()
        self._devices = gpu_devices()  # none in a CPU build
        self.settings = self._fit(self.requested, target_path, draft_path)
        self._draft_sha256 = draft_sha256
        self._models: list[Model] = []
        self._runners: list[CachedModel] = []  # the contexts made so far (closed in reverse)
        self._adapter: LoraAdapter | None = None  # the draft's LoRA (a parallel drafter), if loaded
        self.where = ""  # where the target runs if not just here: "RPC 10.0.0.2:50052 + this machine (CPU)"
        try:
            placement = self._placement()
            target_model = self._load(target_path, int(self.settings.target_gpu_layers), placement)
            target_settings = self.settings.context(self.settings.target_on_cpu, self.settings.reductions)
            self.target = Target(Context(target_model, target_settings))
            self._runners.append(self.target)
            self.draft: Draft | None = None
            if draft_path:
                draft_model = self._load(draft_path, int(self.settings.draft_gpu_layers))
                check_pairing(target_model, draft_model)
                draft_on_cpu = self.settings.draft_gpu_layers == 0
                self.draft = Draft(
                    Context(draft_model, self.settings.context(draft_on_cpu, self.settings.reductions)),
                    top_k=self.settings.draft_top_k,
                    vocab_limit=target_model.n_vocab,
                )
                self._runners.append(self.draft)
            self.runs_on = self._runs_on()  # read once: a server's /health reads it from other threads
        except BaseException:
            self.close()
            raise

    def _fit(self, settings: EngineSettings, target_path: str, draft_path: str | None) -> EngineSettings:
        """``settings`` with ``auto`` offload made counts: 0 without a GPU, and with RPC servers (their
        placement decides where the target runs); else what fits (offload.fit_layers), sized by
        no_alloc loads of both models (~1 s for the 1.5B on a 2-core CPU)."""
        asked = (settings.target_gpu_layers, settings.draft_gpu_layers if draft_path else 0)
        if AUTO not in asked:
            return settings
        if settings.rpc or not self._devices:
            target, draft = (0 if layers == AUTO else int(layers) for layers in asked)
        else:
            shape = settings.context(cpu_only=False)
            sized = {
                path: footprint(path, shape.n_ctx, shape.n_batch, shape.n_seq_max, shape.flash_attn)
                for path in (target_path, draft_path)
                if path
            }
            target, draft = fit_layers(self._devices, sized[target_path], sized.get(draft_path or ""), asked)
        return replace(settings, target_gpu_layers=target, draft_gpu_layers=draft)

    def _runs_on(self) -> dict[str, RunsOn]:
        """Where the target (and the draft) run: device, layers there / all (offload.RunsOn)."""
        layers = {"target": self.settings.target_gpu_layers, "draft": self.settings.draft_gpu_layers}
        runners = {"target": self.target, "draft": self.draft}
        where = {
            name: runs_on(int(layers[name]), runner.model.n_layer, self._devices)
            for name, runner in runners.items()
            if runner is not None
        }
        if self.where:  # on RPC servers: their summary names the devices
            where["target"] = replace(where["target"], device=self.where)
        return where

    def runs_on_json(self) -> dict[str, dict]:
        """``runs_on`` for JSON: {"target": {"device", "gpu_layers", "layers"}, "draft": {…}}."""
        return {name: place.as_dict() for name, place in self.runs_on.items()}

    def _placement(self) -> Placement | None:
        """The target's devices on the RPC servers and here, when servers are named."""
        settings = self.settings
        if not settings.rpc:
            if settings.tensor_split:
                raise EngineError("--tensor-split splits the target over RPC servers: give them with --rpc.")
            return None
        placement = Placement(
            settings.rpc, settings.tensor_split, settings.target_gpu_layers != 0, settings.rpc_timeout
        )
        self.where = placement.describe()
        return placement

    def _load(self, path: str, gpu_layers: int, placement: Placement | None = None) -> Model:
        # A crashing native kernel would kill this process: try it in a child first (once per build,
        # CPU and file; cached). Not for a target on RPC servers: the child would load all of it here.
        from .probe import ensure_backend_works  # imported late: the probe is also `python -m` run

        repack = self.settings.repack and not amx_guard()
        if placement is None:
            reductions = self.settings.context(gpu_layers == 0, self.settings.reductions).reductions
            ensure_backend_works(path, repack, gpu_layers, system_info(), self.settings.probe_dir, reductions)
        model = Model(path, n_gpu_layers=gpu_layers, repack=self.settings.repack, placement=placement)
        self._models.append(model)
        return model

    @property
    def reductions(self) -> str:
        """Where the target's output rows are reduced: "numpy" or "backend" (``samplers.resolve``; the
        draft's: the same, on the draft's device)."""
        return self.target.ctx.reductions

    @property
    def max_nodes(self) -> int:
        """Largest tree (root included) the contexts accept."""
        return self.target.n_seq

    def context_used(self) -> int:
        """Tokens in the target's cache (prompt + answer so far)."""
        return len(self.target.committed)

    def overlap(self, tree: DraftTree, pending: Pending) -> None:
        """The draft's look-ahead while a target on RPC servers decodes ``tree`` (``look_ahead_during``)."""
        look_ahead_during(self.target, self.draft, tree, pending)

    def set_up_draft(self, setup: DraftSetup) -> ParallelDrafter | None:
        """Make the draft what a planner drafts with (``Planner.draft_setup``): the plain draft, or a
        ParallelSpec drafter — with the GGUF LoRA adapter ``setup.adapter`` (its metadata gives K and
        the masks; it must have been trained on this draft), or plain with ``setup.masks`` untrained
        masks. The adapter applies to the draft's context only; switching forgets the draft's cache
        (its cells were computed with other weights). Nothing happens when nothing changes. Returns
        the parallel drafter set up, if any."""
        if self.draft is None:
            if setup.masks:
                raise EngineError("ParallelSpec needs a draft model; this pair was loaded without one.")
            return None
        if not setup.masks:
            self._use_adapter(self.draft, None)
            self.draft.mask_ids = ()
            return None
        model = self.draft.model
        spec = read_adapter(setup.adapter) if setup.adapter else untrained(model.n_vocab, setup.masks)
        if max(spec.mask_ids) >= model.n_vocab or min(spec.mask_ids) < 0:
            raise EngineError(f"[MASK] ids {spec.mask_ids} are outside the draft's {model.n_vocab} ids")
        if setup.masks > spec.k:
            raise EngineError(
                f"the adapter {setup.adapter} was trained with K = {spec.k} masks: use --k {spec.k} or fewer"
            )
        if spec.adapter and self._adapter_path() != spec.adapter:
            check_base(spec, model.path, self._draft_sha256)
        self._use_adapter(self.draft, spec.adapter)
        self.draft.mask_ids = spec.mask_ids
        return spec

    @property
    def draft_adapter(self) -> LoraAdapter | None:
        """The draft's LoRA adapter now in use (None: the plain draft): KV it computed is its own."""
        return self._adapter

    def _adapter_path(self) -> str | None:
        return self._adapter.path if self._adapter is not None else None

    def _use_adapter(self, draft: Draft, path: str | None) -> None:
        if self._adapter_path() == path:
            return
        adapter = LoraAdapter(draft.model, path) if path else None
        draft.ctx.use_adapter(adapter)
        if self._adapter is not None:
            self._adapter.close()
        self._adapter = adapter
        CachedModel.sync(draft, [])  # the base sync: Draft.sync wants a pending root token

    def forget(self) -> None:
        """Empty both KV caches: the next prompt is decoded from scratch, so what the caches held before
        (an earlier or cancelled answer) cannot change the next answer's tokens."""
        for runner in (self.target, self.draft):
            if runner is not None:
                CachedModel.sync(runner, [])  # the base sync: Draft.sync wants a pending root token

    def close(self) -> None:
        for runner in reversed(self._runners):  # the draft first
            runner.close()
        self._runners = []
        if self._adapter is not None:  # after the contexts, before its model
            self._adapter.close()
            self._adapter = None
        for model in self._models:
            model.close()
        self._models = []

    def __enter__(self) -> ModelPair:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_pairing(target: Model, draft: Model) -> None:
    """Same tokenizer: type, and the text of every token both vocabularies have.

    Vocabulary sizes may differ by padding (the draft never proposes ids the target lacks), but
    every shared id must mean the same text, or accepted draft tokens would be wrong tokens.
    """
    if target.vocab_type != draft.vocab_type:
        raise PairingError(
            f"tokenizer types differ: target {target.path} has type {target.vocab_type}, draft {draft.path} "
            f"has {draft.vocab_type}. Pick a draft from the same model family (see `edgespec models list`)."
        )
    shared = min(target.n_vocab, draft.n_vocab)
    for token in range(shared):
        t_text, d_text = target.token_text(token), draft.token_text(token)
        if t_text != d_text:
            raise PairingError(
                f"token {token} differs: target {target.path} has {t_text!r}, draft {draft.path} has "
                f"{d_text!r}. These models do not share a tokenizer; pick a draft of the same family."
            )
    larger = target if target.n_vocab > draft.n_vocab else draft
    for token in range(shared, larger.n_vocab):
        text = larger.token_text(token)
        if not (text.startswith(b"[PAD") or text.startswith(b"<|") or text == b""):
            raise PairingError(
                f"vocabularies differ beyond padding: {larger.path} has {larger.n_vocab} tokens, the other "
                f"{shared}; token {token} is {text!r}. Pick a draft of the same model family."
            )
