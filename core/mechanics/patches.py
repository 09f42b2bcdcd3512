"""Every change this tool makes to a loaded model or to transformers' registries, and its undo: one module.

A model runs our attention through transformers' own dispatch, but a few things of the model and of transformers
have to change for that, and each is listed here (:data:`PATCHES`), made here and undone here:

- ``implementation``: the model's configs name an attention implementation (``config._attn_implementation``,
  every sub-config too: T5's stacks keep their own copies). :func:`set_implementation`, :func:`point` and
  :func:`point_back` write the private field transformers reads (``_attn_implementation_internal``); a
  :class:`Patched` keeps what each config named before.
- ``lazy-bias``: each T5-family module owning a relative bias table gets a subclass of its own class that hands
  our attention the bias as one vector per head (:class:`core.mechanics.relative_bias.LazyBias`).
- ``rotary``: each rotary embedding module gets a subclass of its own class that rotates as the pass's position
  scheme says (:func:`_scheme_rotary_class`), read from the call under way through a callable the caller passes
  down (this module sits below the attention call's context).
- ``registry``: names in transformers' process-wide ``AttentionInterface`` / ``AttentionMaskInterface``
  (``aligned``, and ``aligned@N`` for a model's standing settings): :func:`register_name` and
  :func:`release_name`, which removes the name (a released name holds nothing: a lookup raises KeyError).
- ``mlp-rows``: each decoder layer's feed-forward module (a decoder-only LM's ``mlp``) gets a subclass of its own
  class that runs a long input in blocks of :data:`MLP_ROWS` positions (:func:`_rows_mlp_class`): the same
  position-wise function, a block's intermediate activations at a time instead of the whole input's.
- ``hold``: bookkeeping of who needs a user's model switched to our attention (:mod:`core.runs.apply`):
  :func:`hold_of`, :func:`set_hold`, :func:`drop_hold`, kept beside the model (a weak mapping), never in it.

A class swap keeps ``isinstance``, the parameters and the ``state_dict`` as they were (the subclass adds no
state); undoing it restores each module's own class. :func:`patch` is the one apply (at load, by
:func:`core.models.load`, and by :mod:`core.runs.apply` for a user's own model); :meth:`Patched.undo` undoes what
that one call changed, :func:`unpatch` everything this module did to a model. tests/mechanics/test_patches.py lists every
patch, checks that undo gives the model back unchanged, and fails if a patch is made anywhere else in core/ or ui/.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from core.kinds import is_aligned
from core.mechanics.relative_bias import LazyBias, bias_owners
from core.values.positions import rotary_modules

if TYPE_CHECKING:  # pragma: no cover
    from core.values.positions import Bound

#: Every kind of patch this module makes, with what it changes.
PATCHES: dict[str, str] = {
    "implementation": "configs' attention implementation (the private _attn_implementation_internal field)",
    "lazy-bias": "T5 bias owners' class swapped for a LazyBias subclass",
    "rotary": "rotary embedding modules' class swapped for a scheme-reading subclass",
    "registry": "names in transformers' AttentionInterface and AttentionMaskInterface",
    "mlp-rows": "decoder layers' feed-forward modules' class swapped for a subclass that runs blocks of rows",
    "hold": "who holds a user's model on our attention (a weak mapping beside the model)",
}

#: Positions a decoder layer's feed-forward module takes at once (``mlp-rows``). Why: it is position-wise, and on a
#: whole long prompt its intermediate activations are the pass's largest tensors (SmolLM2 at 32,768 tokens: three
#: of 32,768 x 1,536 float32, 0.6 GB, beside a KV cache of 1.4 GB); in blocks of 4,096 positions they are 75 MB each.
MLP_ROWS = 4096

#: The private config field transformers reads the implementation from (``config._attn_implementation``).
_FIELD = "_attn_implementation_internal"

_LOCK = threading.RLock()
#: Modules whose class we swapped -> their own class (weak: a dropped model takes its entries with it).
_ORIGINAL: "weakref.WeakKeyDictionary[Any, type]" = weakref.WeakKeyDictionary()
#: The patches made to each model, oldest first (:func:`unpatch` undoes them newest first).
_RECORDS: "weakref.WeakKeyDictionary[Any, list[Patched]]" = weakref.WeakKeyDictionary()
#: Models whose rotary modules are swapped already: every scheme pass asks, so the answer is one set lookup.
_ROTATING: "weakref.WeakSet[Any]" = weakref.WeakSet()
_HOLDS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
#: The names :func:`register_name` holds in transformers' registries now.
_NAMES: set[str] = set()
_LAZY: dict[type, type] = {}
_ROTARY: dict[tuple[type, Callable], type] = {}
_ROWS: dict[type, type] = {}


# -- configs: the attention implementation ---------------------------------------------------------------------


def configs(model: Any) -> list:
    """Every config the model's attention reads ``_attn_implementation`` from (the top one, each sub-model's, e.g.
    T5's encoder and decoder stacks), each once."""
    seen: dict[int, object] = {}

    def add(cfg) -> None:
        if cfg is None or id(cfg) in seen:
            return
        seen[id(cfg)] = cfg
        for key in getattr(cfg, "sub_configs", {}) or {}:
            add(getattr(cfg, key, None))

    add(model.config)
    for mod in model.modules():
        add(getattr(mod, "config", None))
    return list(seen.values())


def named(cfg: Any) -> object:
    """What ``cfg`` names as its implementation in its own field (None: transformers' default)."""
    return cfg.__dict__.get(_FIELD)


def _name(cfg: Any, value: object) -> None:
    cfg.__dict__[_FIELD] = value


def point(model: Any, name: str) -> list[tuple[object, object]]:
    """Make every config of ``model`` name the implementation ``name``; returns ``[(config, what it named)]`` for
    putting them back (:func:`point_back`)."""
    before = [(c, named(c)) for c in configs(model)]
    for cfg, _ in before:
        _name(cfg, name)
    return before


def point_back(before: list[tuple[object, object]]) -> None:
    """Put back what :func:`point` (or :func:`set_implementation` in a :class:`Patched`) found."""
    for cfg, value in before:
        if named(cfg) != value:
            _name(cfg, value)


def set_implementation(model: Any, name: str) -> None:
    """Run ``model``'s attention through ``name`` (``"aligned"``, ``"sdpa"``, ``"eager"``...) in every config it
    reads: transformers' ``set_attn_implementation`` and then each sub-config it did not reach.

    Why: transformers 5.17's ``set_attn_implementation`` on T5 changes only the top config, and T5's encoder and
    decoder stacks keep copies of their own: a model built with sdpa and then switched to ours ran sdpa in
    every layer, silently (bench/gpu.py on a GPU with 5.17 gave the same time for both; issue 49). 5.24 reaches
    the stacks; this works on both."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    for cfg in configs(model):
        if cfg._attn_implementation != name:
            _name(cfg, name)


# -- class swaps ------------------------------------------------------------------------------------------------


def _swap(module: Any, cls: type) -> None:
    _ORIGINAL.setdefault(module, type(module))
    module.__class__ = cls


def _restore(module: Any) -> bool:
    original = _ORIGINAL.pop(module, None)
    if original is None:
        return False
    module.__class__ = original
    return True


def original_class(module: Any) -> type:
    """The class ``module`` had before any swap of ours (its own class when it has none)."""
    return _ORIGINAL.get(module, type(module))


def _lazy_class(cls: type) -> type:
    """The lazy-bias subclass of ``cls``, made once per class (so ``isinstance`` and ``state_dict`` are unchanged)."""
    if cls not in _LAZY:
        _LAZY[cls] = type(f"Lazy{cls.__name__}", (LazyBias, cls), {"__module__": LazyBias.__module__})
    return _LAZY[cls]


def _scheme_rotary_class(base: type, current: Callable[[], "Bound | None"]) -> type:
    """A subclass of a transformers rotary module class whose ``forward`` rotates as the pass's scheme says.

    ``current()`` gives the :class:`~core.values.positions.Bound` of the pass under way in this thread (None: no
    scheme), read when the model computes its cos and sin. With one, cos and sin come from
    :meth:`Bound.model_rotation` (the scheme's frequencies and attention factor; zeros, so no rotation at all, for a
    scheme that rectifies distances: the attention rotates); otherwise, and for a scheme that keeps the model's
    frequencies, the parent's own forward. The formula is the rotary embedding's: angle = position x inverse
    frequency, cos and sin of the angles repeated over the two halves, times the attention factor.

    Why per call and not by overwriting the module's frequency buffers for a pass (what this replaced): the model
    is shared (the app serves many sessions from one), so a pass had to hold a per-model lock from the overwrite to
    the restore, and a pass in another thread waited or, without the lock, read another scheme's frequencies. Now
    a pass's scheme travels with the call, and two threads with two schemes run side by side on one model.
    transformers' dynamic frequency update (which keeps the longest length it has seen) is bypassed during a
    scheme's pass: the scheme's frequencies are computed for the pass."""

    def forward(self, x, position_ids, *args, **kwargs):
        bound = current()
        layer_type = kwargs.get("layer_type", args[0] if args else None)
        rotation = None if bound is None else bound.model_rotation(self.config, layer_type)
        if rotation is None:
            return base.forward(self, x, position_ids, *args, **kwargs)
        import torch

        inv, factor = rotation
        freqs = position_ids[..., None].float() * inv.to(device=x.device, dtype=torch.float)
        angles = torch.cat((freqs, freqs), dim=-1)
        return (angles.cos() * factor).to(dtype=x.dtype), (angles.sin() * factor).to(dtype=x.dtype)

    return type(
        f"Scheme{base.__name__}",
        (base,),
        {"forward": forward, "__doc__": _scheme_rotary_class.__doc__, "_scheme_base": base},
    )


def _rows_mlp_class(base: type) -> type:
    """A subclass of a decoder layer's feed-forward class whose ``forward`` runs inputs of more than
    :data:`MLP_ROWS` positions in blocks of that many (``[batch, positions, hidden]``; any other shape, and short
    inputs, go to the parent's forward as they are). Each position's output is the parent's on that position: the
    module mixes no positions (tests/mechanics/test_patches.py holds the outputs to the parent's)."""
    if base in _ROWS:
        return _ROWS[base]

    def forward(self, x, *args, **kwargs):
        if args or kwargs or x.dim() != 3 or x.shape[1] <= MLP_ROWS:
            return base.forward(self, x, *args, **kwargs)
        import torch

        return torch.cat([base.forward(self, part) for part in x.split(MLP_ROWS, dim=1)], dim=1)

    _ROWS[base] = type(f"Rows{base.__name__}", (base,), {"forward": forward, "_rows_base": base})
    return _ROWS[base]


def feed_forwards(model: Any) -> list[Any]:
    """A decoder-only LM's feed-forward modules (each decoder layer's ``mlp``: Llama, Mistral, Qwen2/3, Gemma 2,
    Phi-3); none for any other model."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "is_encoder_decoder", False) or not type(model).__name__.endswith("ForCausalLM"):
        return []
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    return [layer.mlp for layer in layers if callable(getattr(getattr(layer, "mlp", None), "forward", None))]


def rotating(module: Any) -> bool:
    """Whether ``module`` is a rotary module swapped for a scheme-reading subclass."""
    return getattr(type(module), "_scheme_base", None) is not None


# -- the one apply / undo pair ------------------------------------------------------------------------------------


@dataclass(eq=False)
class Patched:
    """What one :func:`patch` call changed on a model, and its :meth:`undo`."""

    model: "weakref.ref[Any]"
    classes: list[Any] = field(default_factory=list)  # the modules whose class this call swapped
    named: list[tuple[object, object]] | None = None  # [(config, what it named)] before this call switched them
    kinds: set[str] = field(default_factory=set)  # which PATCHES this call made
    undone: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.classes or self.named is not None)

    def undo(self) -> None:
        """Put back what this call changed: each swapped module's own class, each config's implementation.
        Idempotent."""
        with _LOCK:
            if self.undone:
                return
            self.undone = True
            for module in reversed(self.classes):
                _restore(module)
            model = self.model()
            if model is not None and "rotary" in self.kinds:
                _ROTATING.discard(model)
            if self.named is not None:
                _put_back_implementation(model, self.named)
            if model is not None and self in _RECORDS.get(model, ()):
                _RECORDS[model].remove(self)


def _put_back_implementation(model: Any, entries: list[tuple[object, object]]) -> None:
    top = next((v for c, v in entries if model is not None and c is model.config), None)
    if model is not None and isinstance(top, str) and top != model.config._attn_implementation:
        try:  # the public way first; then make every config exactly what it was
            model.set_attn_implementation(top)
        except Exception:  # noqa: BLE001 - e.g. a kernel no longer loadable; the loop below still restores
            pass
    point_back(entries)


def patch(
    model: Any, *, implementation: str | None = None, rotary: Callable[[], "Bound | None"] | None = None
) -> Patched:
    """Patch ``model`` to run our attention; returns what this call changed (:meth:`Patched.undo` undoes it).

    Always: every T5-family bias owner hands out a lazy bias (``lazy-bias``), and a decoder-only LM's feed-forward
    modules run long inputs in blocks of rows (``mlp-rows``). With ``implementation`` (e.g.
    ``"aligned"``): every config names it, unless every config names one of ours already (``implementation``).
    With ``rotary`` (the call's bound scheme, read per call): every rotary module rotates as the scheme says
    (``rotary``). Idempotent: what is patched already is left alone (and not recorded again), and a model already
    patched for rotation costs one set lookup."""
    with _LOCK:
        done = Patched(weakref.ref(model))
        if implementation is not None:
            entries = [(c, named(c)) for c in configs(model)]
            if not all(is_aligned(c._attn_implementation) for c, _ in entries):
                set_implementation(model, implementation)
                done.named = entries
                done.kinds.add("implementation")
        for m in bias_owners(model):
            if not isinstance(m, LazyBias):
                _swap(m, _lazy_class(type(m)))
                done.classes.append(m)
                done.kinds.add("lazy-bias")
        for m in feed_forwards(model):
            if getattr(type(m), "_rows_base", None) is None:
                _swap(m, _rows_mlp_class(type(m)))
                done.classes.append(m)
                done.kinds.add("mlp-rows")
        if rotary is not None and model not in _ROTATING:
            for m in rotary_modules(model):
                if rotating(m):
                    continue
                cls = type(m)
                sub = _ROTARY.get((cls, rotary))
                if sub is None:
                    sub = _ROTARY[(cls, rotary)] = _scheme_rotary_class(cls, rotary)
                _swap(m, sub)
                done.classes.append(m)
                done.kinds.add("rotary")
            _ROTATING.add(model)
        if done.changed:
            _RECORDS.setdefault(model, []).append(done)
        return done


def rotate_per_call(model: Any, current: Callable[[], "Bound | None"]) -> None:
    """Let ``model``'s rotary modules take their rotation from the pass under way (``current``): :func:`patch`
    with ``rotary`` alone. Idempotent, one set lookup once done."""
    if model not in _ROTATING:
        patch(model, rotary=current)


def unpatch(model: Any) -> None:
    """Undo every :func:`patch` of ``model``, newest first: the model as it was before this module touched it."""
    with _LOCK:
        for done in reversed(list(_RECORDS.get(model, ()))):
            done.undo()
        _RECORDS.pop(model, None)


def patched(model: Any) -> list[Patched]:
    """The patches of ``model`` still in force, oldest first."""
    return list(_RECORDS.get(model, ()))


# -- transformers' registries --------------------------------------------------------------------------------------


def register_name(name: str, attention: Callable, mask: Callable) -> None:
    """Register ``attention`` and ``mask`` under ``name`` in transformers' process-wide registries (replacing what
    the name held)."""
    with _LOCK:
        AttentionInterface.register(name, attention)
        AttentionMaskInterface.register(name, mask)
        _NAMES.add(name)


def release_name(name: str) -> None:
    """Remove ``name`` from transformers' registries (idempotent): a released name holds nothing. transformers has
    no public way to unregister (``GeneralInterface.__delitem__`` only drops an instance's local override), so the
    class-wide mapping ``register`` writes is popped here."""
    with _LOCK:
        AttentionInterface._global_mapping.pop(name, None)
        AttentionMaskInterface._global_mapping.pop(name, None)
        _NAMES.discard(name)


def registered_names() -> set[str]:
    """The names :func:`register_name` holds in transformers' registries now."""
    return set(_NAMES)


# -- bookkeeping: who holds a user's model ---------------------------------------------------------------------------


def hold_of(model: Any) -> Any:
    """What :func:`set_hold` left for ``model`` (None: nothing)."""
    return _HOLDS.get(model)


def set_hold(model: Any, hold: Any) -> None:
    _HOLDS[model] = hold


def drop_hold(model: Any, hold: Any) -> bool:
    """Forget ``model``'s hold if it is ``hold``; whether it was."""
    if _HOLDS.get(model) is hold:
        del _HOLDS[model]
        return True
    return False
