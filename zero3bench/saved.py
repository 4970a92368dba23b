"""
What a Hugging Face model keeps for backward, counted rather than written per family: its forward runs on the meta
device (shapes and dtypes, no memory, no arithmetic) at the run's sequence length, dtype and micro batch, and every
storage that the forward makes and that is still alive when it ends is what autograd saved (or, with checkpointing,
what the checkpoints keep: the blocks' inputs), each counted once, however many ops saved it. The region of the model
that made each storage (before the blocks, a block, the layers above them) tells the accounting which of them a
recomputed block makes again and which the output layer frees (accounting/memory.counted_bytes).

Attention runs the kernel that the run will: on the CPU, the one PyTorch chooses there (asked with small tensors of
the same dtype, heads and mask); on a GPU, the one PyTorch's CUDA dispatch would choose (asked where a GPU is here,
else its rule: flash for 16 bits without a mask, memory-efficient otherwise, the math path where neither takes the
heads), each with the saved tensors of PyTorch's own kernel on the meta device: flash and memory-efficient keep O(s)
per head, the math path the O(s^2) probabilities and dropout's mask. Mixtures of experts are counted as
transformers' default grouped_mm runs them: every token's k routes gathered into one batch, so the tokens routed to
the experts together are always k per token, however the router splits them; a per-expert loop (experts
"eager") reads the routing's values, which the meta device has not, and is not counted.
"""
import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakTensorKeyDictionary

from zero3bench.accounting.shapes import Kept, Saved

BEFORE, AFTER = -1, -2  # the regions outside the blocks, which are numbered from 0
FLASH, EFFICIENT, MATH, CUDNN, CPU_FLASH = "flash", "efficient", "math", "cudnn", "cpu-flash"
BACKENDS = {0: MATH, 1: FLASH, 2: EFFICIENT, 3: CUDNN}  # torch.nn.attention.SDPBackend's values
VALUED = 1 << 22  # elements: the largest tensor computed from the token ids alone whose values are kept beside
aten = torch.ops.aten
# ops whose output's size is in the values that they read (a per-expert loop's tokens, DBRX's)
SIZED_BY_VALUES = {aten.nonzero.default, aten.masked_select.default, aten.repeat_interleave.Tensor,
                   aten._unique2.default, aten.unique_consecutive.default, aten.unique_dim.default}


class Uncountable(Exception):
    """What a model's forward does that the meta device cannot follow, in words."""


def cuda_rule(q: torch.Tensor, mask: torch.Tensor | None, gqa: bool) -> str:
    """PyTorch's CUDA choice as its sdp_utils checks it, for a machine without a GPU: flash takes 16-bit inputs,
    no mask and heads of at most 256; memory-efficient any dtype and a mask, but not fewer key heads than query
    heads; the math path the rest."""
    head = q.shape[-1]
    if q.dtype in (torch.float16, torch.bfloat16) and mask is None and head <= 256:
        return FLASH
    return EFFICIENT if not gqa and head % 8 == 0 else MATH


def asked(device: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout: float,
          causal: bool, gqa: bool) -> str:
    """The kernel that PyTorch chooses on the device for these dtypes, heads, positions and mask
    (torch._fused_sdp_choice), asked with one row of each, as each requires grad: the choice does not read the rows,
    but a CPU's flash kernel gives no gradient to a mask that needs one (Doge's learned one)."""
    def row(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else torch.zeros((1, *t.shape[1:]), dtype=t.dtype, device=device,
                                                  requires_grad=t.requires_grad)
    choice = torch._fused_sdp_choice(row(q), row(k), row(v), row(mask), dropout, causal, enable_gqa=gqa)
    kernel = BACKENDS.get(int(choice), MATH)
    return CPU_FLASH if device == "cpu" and kernel == FLASH else kernel


class Attention(TorchFunctionMode):
    """F.scaled_dot_product_attention as the run's device runs it, on the meta device: the kernel chosen, called as
    PyTorch's own dispatch calls it (attention.cpp: a boolean mask made additive, a mask padded for memory-efficient
    attention, heads padded to 8 for CUDA's flash), so that autograd saves what it saves there."""

    def __init__(self, on_gpu: bool) -> None:
        super().__init__()
        self.on_gpu, self.used = on_gpu, set()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is not F.scaled_dot_product_attention:
            return func(*args, **(kwargs or {}))
        return self.attend(*args, **(kwargs or {}))

    def kernel(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout: float,
               causal: bool, gqa: bool) -> str:
        if self.on_gpu and not torch.cuda.is_available():
            return cuda_rule(q, mask, gqa)
        return asked("cuda" if self.on_gpu else "cpu", q, k, v, mask, dropout, causal, gqa)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
               dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
               enable_gqa: bool = False) -> torch.Tensor:
        gqa = enable_gqa and k.shape[-3] != q.shape[-3]
        kernel = self.kernel(q, k, v, attn_mask, dropout_p, is_causal, gqa)
        self.used.add(kernel)
        mask = attn_mask
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.zeros_like(mask, dtype=q.dtype).masked_fill_(mask.logical_not(), -float("inf"))
        if kernel == FLASH:
            head = q.shape[-1]
            padded = [F.pad(t, (0, -head % 8)) if head % 8 else t for t in (q, k, v)]
            scale = q.shape[-1] ** -0.5 if scale is None else scale
            return aten._scaled_dot_product_flash_attention(*padded, dropout_p, is_causal, scale=scale)[0][..., :head]
        if kernel == CPU_FLASH:
            return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, attn_mask=mask,
                                                                    scale=scale)[0]
        if kernel == CUDNN:
            return aten._scaled_dot_product_cudnn_attention(q, k, v, mask, True, dropout_p, is_causal, False,
                                                            scale=scale)[0]
        if kernel == EFFICIENT:
            if mask is not None and mask.shape[-1] % 16:
                mask = F.pad(mask, (0, -mask.shape[-1] % 16))[..., :mask.shape[-1]]
            if mask is not None:
                mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
            return aten._scaled_dot_product_efficient_attention(q, k, v, mask, True, dropout_p, is_causal,
                                                                scale=scale)[0]
        return aten._scaled_dot_product_attention_math(q, k, v, mask, dropout_p, is_causal, scale=scale,
                                                       enable_gqa=gqa)[0]


@dataclass
class Made:
    """A storage that the forward made, weakly held, and the region that made it."""
    storage: weakref.ref
    region: int


def tensors_in(tree: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


class Forward(TorchDispatchMode):
    """A forward on the meta device: every storage that it makes and the region that made it, and beside, on the
    CPU, the values of what it computes from the token ids alone, for the few reads of a value that transformers'
    Python code makes on them (a check for packed sequences, for padding)."""

    def __init__(self, on_gpu: bool = True) -> None:
        super().__init__()
        self.on_gpu, self.region, self.made, self.values = on_gpu, BEFORE, {}, WeakTensorKeyDictionary()
        self.held: set[int] = set()  # the storages that the forward is given (weights, buffers, token ids)
        self.modules: list[str] = []  # the modules whose forward runs, innermost last
        self.tainted: set[int] = set()  # storages made from what a marked module returned (watching)
        # what autograd saves, held here as well: a storage that only C++ holds (a custom autograd Function's saved
        # input, PhiMoE's router) may lose its Python object, and with it the weak reference, while it lives
        self.saved: dict[int, torch.UntypedStorage] = {}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        """saved_tensors_hooks' pack: the tensor as it is, its storage noted, and made where it was saved if no op
        that this mode saw made it (a kernel's own tensor: torch 2.11's math attention on a CPU saves four int64
        scalars)."""
        storage = tensor.untyped_storage()
        self.saved[storage._cdata] = storage
        self.note_made(storage)
        return tensor

    def note_made(self, storage: torch.UntypedStorage) -> None:
        """The storage made in the region that runs, unless the forward was given it or knows it already."""
        known = self.made.get(storage._cdata)
        if storage._cdata not in self.held and (known is None or known.storage() is None):
            # an address freed and made again is a new storage
            self.made[storage._cdata] = Made(weakref.ref(storage), self.region)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default:
            if args[0] not in self.values:
                raise Uncountable(f"{self.where()} reads a value of its activations (Tensor.item), which the meta "
                                  "device does not compute")
            return self.values[args[0]].item()
        if func in SIZED_BY_VALUES and not all(t in self.values for t in tensors_in((args, kwargs))):
            raise Uncountable(f"{self.where()} reads the values of its activations ({func.overloadpacket.__name__}, "
                              "whose output is as large as they say), which the meta device does not compute")
        out = func(*args, **kwargs)
        if func is aten.native_layer_norm.default and not self.on_gpu:
            # the meta kernel keeps the mean and rstd in fp32, as CUDA's does; the CPU's keeps them in the input's
            out = (out[0], out[1].to(args[0].dtype), out[2].to(args[0].dtype))
        self.value(func, args, kwargs, out)
        if any(t.untyped_storage()._cdata in self.tainted for t in tensors_in((args, kwargs))):
            self.tainted.update(t.untyped_storage()._cdata for t in tensors_in(out))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "meta":
                self.note_made(t.untyped_storage())
        return out

    def value(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """The op's outputs' values, where every tensor it reads has one and they are small; else none."""
        inputs, outputs = tensors_in((args, kwargs)), tensors_in(out)
        if not all(t in self.values for t in inputs) or sum(t.numel() for t in outputs) > VALUED:
            for t in outputs:
                self.values.pop(t, None)
            return

        def real(a: Any) -> Any:
            if isinstance(a, torch.Tensor):
                return self.values[a]
            return torch.device("cpu") if isinstance(a, torch.device) and a.type == "meta" else a
        computed = func(*pytree.tree_map(real, args), **pytree.tree_map(real, kwargs))
        for t, v in zip(outputs, tensors_in(computed)):
            self.values[t] = v

    def where(self) -> str:
        return self.modules[-1] if self.modules else "the model"

    def alive(self) -> list[tuple[torch.UntypedStorage, int]]:
        """Each storage that the forward made and that lives: weakly held, or saved for backward."""
        return [(s, made.region) for key, made in self.made.items()
                if (s := made.storage() or self.saved.get(key)) is not None]


@contextlib.contextmanager
def meta_forward(model: Any, layers: list[Any], forward: Forward) -> Iterator[None]:
    """Hooks that tell forward which region runs (each block's, then the layers above them) and which module."""
    hooks = [b.register_forward_pre_hook(lambda *_, i=i: setattr(forward, "region", i)) for i, b in enumerate(layers)]
    hooks += [b.register_forward_hook(lambda *_: setattr(forward, "region", AFTER)) for b in layers]
    hooks += [torch.nn.modules.module.register_module_forward_pre_hook(
                  lambda m, _: forward.modules.append(type(m).__name__)),
              torch.nn.modules.module.register_module_forward_hook(lambda *_: forward.modules.pop() and None)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(forward.pack, lambda tensor: tensor):
            yield
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
        raise Uncountable(f"{forward.where()} cannot run on the meta device ({type(e).__name__}: "
                          f"{str(e).strip().splitlines()[0] if str(e).strip() else ''})") from None
    finally:
        for hook in hooks:
            hook.remove()


def logits_of(model: Any, micro_batch: int, seq: int, forward: Forward) -> torch.Tensor:
    """The model's forward in training mode on the meta device, on token ids of micro_batch rows of seq, whose
    values forward knows."""
    ids = torch.arange(micro_batch * seq).remainder(model.config.vocab_size).view(micro_batch, seq)
    meta = ids.to("meta")
    forward.values[meta] = ids
    forward.held = {t.untyped_storage()._cdata for t in [*model.parameters(), *model.buffers(), meta]}
    with forward:
        return model(input_ids=meta, use_cache=False).logits


@contextlib.contextmanager
def watching(forward: Forward, attention: Any, mlp: Any) -> Iterator[list[bool]]:
    """For each call of a block's MLP, whether it reads what the block's attention returned, as a sequential block's
    does, where a parallel block's (GPT-NeoX's use_parallel_residual, Falcon's) reads an input made without it: what
    attention returns marked, and every storage made from a marked one (Forward.tainted)."""
    reads: list[bool] = []
    hooks = [] if attention is None or mlp is None else [
        attention.register_forward_hook(
            lambda _m, _a, out: forward.tainted.update(t.untyped_storage()._cdata for t in tensors_in(out))),
        mlp.register_forward_pre_hook(lambda _m, args: reads.append(
            any(t.untyped_storage()._cdata in forward.tainted for t in tensors_in(args))))]
    try:
        yield reads
    finally:
        for hook in hooks:
            hook.remove()


def forward_kept(model: Any, layers: list[Any], micro_batch: int, seq: int, on_gpu: bool,
                 block: tuple[Any, Any]) -> dict[str, Any]:
    """One forward: what it keeps by region, in bytes (BEFORE, AFTER, each block's), its logits' bytes, the
    attention kernels it ran, and whether block's (attention, MLP) is a parallel one (watching; None where it has
    no attention module or MLP)."""
    forward, attention = Forward(on_gpu), Attention(on_gpu)
    with meta_forward(model, layers, forward), attention, watching(forward, *block) as reads:
        logits = logits_of(model, micro_batch, seq, forward)
    out = logits.untyped_storage()
    kept: dict[int, int] = {}
    for storage, region in forward.alive():
        if storage._cdata != out._cdata:
            kept[region] = kept.get(region, 0) + storage.nbytes()
    return {"kept": kept, "logits": out.nbytes(), "attention": attention.used,
            "parallel": not reads[0] if reads else None}


def kept_at(model: Any, layers: list[Any], micro_batch: int, seq: int, on_gpu: bool,
            checkpointing: Callable[[bool], None] | None, block: tuple[Any, Any]) -> tuple[Kept, dict[str, Any]]:
    """What the model keeps for backward at one micro batch: a forward without checkpointing (whose kernels and
    block it returns too), then one with; a model that cannot checkpoint (checkpointing None), whose runs with it
    are refused (hf.check_checkpointing), keeps the same."""
    plain = checkpointed = forward_kept(model, layers, micro_batch, seq, on_gpu, block)
    if checkpointing is not None:
        checkpointing(True)
        try:
            checkpointed = forward_kept(model, layers, micro_batch, seq, on_gpu, (None, None))
        finally:
            checkpointing(False)
    blocks = [plain["kept"].get(i, 0) for i in range(len(layers))]
    return Kept(total=sum(plain["kept"].values()), checkpointed=sum(checkpointed["kept"].values()),
                head=plain["kept"].get(AFTER, 0), first_block=blocks[0], most_block=max(blocks),
                logits=plain["logits"]), plain


def counted(model: Any, layers: list[Any], seq: int, dtype: str, on_gpu: bool,
            checkpointing: Callable[[bool], None] | None, block: tuple[Any, Any]) -> tuple[Saved, bool | None]:
    """What a model built on the meta device in dtype keeps for backward at seq, on a GPU or a CPU, at micro
    batches 1, 2 and 3 (shapes.Saved), and whether its first block, block's (attention, MLP), is a parallel one
    (watching); Uncountable where its forward cannot run there."""
    model.train()
    one, seen = kept_at(model, layers, 1, seq, on_gpu, checkpointing, block)
    two, _ = kept_at(model, layers, 2, seq, on_gpu, checkpointing, block)
    three, _ = kept_at(model, layers, 3, seq, on_gpu, checkpointing, block)
    attention = ", ".join(sorted(seen["attention"])) or model.config._attn_implementation
    count = Saved(seq=seq, dtype=dtype, on_gpu=on_gpu, attention=attention, one=one, two=two, three=three)
    return count, seen["parallel"]
