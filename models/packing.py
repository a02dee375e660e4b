"""Padding-free execution, shared by the three models: the real tokens of a batch as one (1, N) row, and attention
per sequence in groups of similar length.

A model runs padding-free when `plan_packing` returns a `PackedBatch`: from a right-padded batch (`pack_padded`) or from
transformers' flattened format (`pack_flattened`, one row whose position_ids restart at 0 per sequence).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class PackedBatch:
    """Where the N real tokens of a batch live, for running a model on (1, N, ...) tensors instead of (B, L, ...).

    Two inputs give one: a padded batch with a right-padded 2D attention mask (`pack_padded`), or a flattened batch in
    transformers' padding-free format, one row whose `position_ids` restart at 0 for every sequence (`pack_flattened`,
    as `DataCollatorWithFlattening` builds it). Either way the packed row holds the sequences one after another, and
    `indices` says where each token sits in the `(rows, width)` grid of the padded layout.

    indices: (N,) long, flat position `row * width + column` of every real token in the grid.
    cu_seqlens: (rows + 1,) int32, where each sequence starts in the packed row (flash-attention's varlen layout).
    lengths: the rows' lengths as Python ints (0 for a row that is all padding).
    flattened: the input came flattened, so outputs stay (1, N, ...) instead of going back to (rows, width, ...).
    """

    indices: torch.Tensor
    cu_seqlens: torch.Tensor
    lengths: list[int]
    width: int
    flattened: bool = False
    # `groups(multiple_of)` by multiple_of: built by the first layer of a pass that attends in groups
    _groups: dict[int, list[AttentionGroup]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def max_seqlen(self) -> int:
        return max(self.lengths)

    @property
    def num_tokens(self) -> int:
        return int(self.indices.shape[0])

    def position_ids(self) -> torch.Tensor:
        """(1, N) position of every token within its own sequence: 0, 1, 2, ... restarting per sequence."""
        return (self.indices % self.width)[None]

    def varlen_kwargs(self) -> dict:
        """The keyword arguments transformers' flash-attention integration reads for a packed (1, N) batch."""
        return {
            "cu_seq_lens_q": self.cu_seqlens,
            "cu_seq_lens_k": self.cu_seqlens,
            "max_length_q": self.max_seqlen,
            "max_length_k": self.max_seqlen,
        }

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        """(rows, width, ...) grid -> (1, N, ...) real tokens. A flattened batch's tensors are already packed."""
        if self.flattened:
            return tensor
        return tensor.flatten(0, 1).index_select(0, self.indices)[None]

    def pack_input(self, tensor: torch.Tensor | None) -> torch.Tensor | None:
        """A per-token input, (rows, width, ...) or (1, width, ...) broadcast over the rows, as the packed (1, N, ...)
        row; None stays None."""
        if tensor is None or self.flattened:
            return tensor
        return self.pack(tensor.expand(self.rows, self.width, *tensor.shape[2:]))

    def unpack(self, tensor: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """(1, N, ...) -> (rows, width, ...), `fill` at padded positions (differentiable)."""
        grid = tensor.new_full((self.rows * self.width, *tensor.shape[2:]), fill)
        return grid.index_copy(0, self.indices, tensor[0]).view(self.rows, self.width, *tensor.shape[2:])

    def restore(self, tensor: torch.Tensor) -> torch.Tensor:
        """(1, N, ...) -> the layout the input came in: (1, N, ...) for a flattened batch, else the padded grid with
        zeros at padded positions."""
        return tensor if self.flattened else self.unpack(tensor)

    def first_tokens(self, tensor: torch.Tensor) -> torch.Tensor:
        """(1, N, ...) -> (rows, ...): each sequence's first token; zeros for a row that is all padding."""
        starts = self.cu_seqlens[:-1].long().clamp_max(max(self.num_tokens - 1, 0))
        first = tensor[0].index_select(0, starts)
        if 0 in self.lengths:
            empty = torch.tensor([n == 0 for n in self.lengths], device=tensor.device)
            first = first.masked_fill(empty.view(-1, *[1] * (first.dim() - 1)), 0.0)
        return first

    def groups(self, multiple_of: int = 1) -> list[AttentionGroup]:
        """The sequences in groups of similar length, each to be attended as a (group rows, group width) padded batch,
        widths rounded up to `multiple_of`; built once per packing and `multiple_of`."""
        if multiple_of not in self._groups:
            self._groups[multiple_of] = attention_groups(self, multiple_of)
        return self._groups[multiple_of]


@dataclass
class AttentionGroup:
    """Sequences of similar length attended together as a padded (rows, width) batch.

    gather: (rows * width,) long, the packed token at each grid slot (padding slots repeat a real token; the key mask
    hides them and their outputs are dropped).
    key_mask: (rows, width) bool, True at real tokens.
    slots: (n,) long, the grid slots of this group's real tokens, in packed order.
    tokens: (n,) long, the packed positions of those tokens.
    """

    rows: int
    width: int
    gather: torch.Tensor
    key_mask: torch.Tensor
    slots: torch.Tensor
    tokens: torch.Tensor


# Cost model of one group for `attention_groups`, in units of one query-key score: every slot of the padded group
# costs its width (scores) plus GROUP_SLOT_COST (projections into and out of the group), and each group a fixed
# overhead (kernel launches, gathers) by device type, far larger on an accelerator than on a CPU (docs/benchmarks.md).
# Only the split depends on it; any split gives the same outputs.
GROUP_SLOT_COST = 64
GROUP_OVERHEAD = {"cpu": 4096}
GROUP_OVERHEAD_ACCELERATOR = 262144


def attention_groups(packing: PackedBatch, multiple_of: int = 1) -> list[AttentionGroup]:
    """Split the non-empty sequences into length groups (sorted by length, cut where the cost model says padding to
    one width wastes more than another group costs) and index each group's padded layout. Widths are rounded up to
    `multiple_of` (a block size)."""
    device = packing.indices.device
    overhead = GROUP_OVERHEAD.get(device.type, GROUP_OVERHEAD_ACCELERATOR)
    order = sorted((i for i, n in enumerate(packing.lengths) if n > 0), key=lambda i: -packing.lengths[i])
    widths = [-(-packing.lengths[i] // multiple_of) * multiple_of for i in order]
    # best[j]: cheapest cost of the first j sequences; cut[j]: where its last group starts.
    best, cut = [0.0] + [math.inf] * len(order), [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        for start in range(end):
            width = widths[start]
            cost = best[start] + (end - start) * width * (width + GROUP_SLOT_COST) + overhead
            if cost < best[end]:
                best[end], cut[end] = cost, start
    bounds, end = [], len(order)
    while end > 0:
        bounds.append((cut[end], end))
        end = cut[end]
    lengths = torch.tensor(packing.lengths, device=device)
    groups = []
    for start, end in reversed(bounds):
        members, width = torch.tensor(order[start:end], device=device), widths[start]
        columns = torch.arange(width, device=device)
        key_mask = columns < lengths[members, None]
        gather = packing.cu_seqlens[members, None].long() + torch.where(key_mask, columns, 0)
        slots = key_mask.flatten().nonzero().squeeze(-1)
        groups.append(
            AttentionGroup(
                rows=len(members),
                width=width,
                gather=gather.flatten(),
                key_mask=key_mask,
                slots=slots,
                tokens=gather.flatten().index_select(0, slots),
            )
        )
    return groups


def run_in_groups(
    packing: PackedBatch,
    run: Callable[..., torch.Tensor],
    *tensors: torch.Tensor,
    multiple_of: int = 1,
) -> torch.Tensor:
    """Run `run(group, *padded)` (attention, or any per-sequence computation) on every length group and put its
    outputs back in packed order.

    tensors: (1, N, ...) packed; `run` gets each as a (group.rows, group.width, ...) padded batch, with
    `group.key_mask`, and returns (group.rows, group.width, ...). Returns (1, N, ...). One group holding every
    sequence at the batch's own width is exactly the padded computation.
    """
    outputs, token_order = [], []
    for group in packing.groups(multiple_of):
        padded = [t[0].index_select(0, group.gather).view(group.rows, group.width, *t.shape[2:]) for t in tensors]
        output = run(group, *padded)
        outputs.append(output.flatten(0, 1).index_select(0, group.slots))
        token_order.append(group.tokens)
    if not outputs:  # every row is padding
        return tensors[0].new_zeros((1, 0, *tensors[0].shape[2:]))
    if len(outputs) == 1:
        output, tokens = outputs[0], token_order[0]
    else:
        output, tokens = torch.cat(outputs), torch.cat(token_order)
    inverse = torch.empty_like(tokens)
    inverse[tokens] = torch.arange(tokens.numel(), device=tokens.device)
    return output.index_select(0, inverse)[None]


def pack_padded(attention_mask: torch.Tensor) -> PackedBatch:
    """The packing of a right-padded batch from its (B, L) attention mask (1 = real token). The caller checks that the
    mask is right-padded (`is_right_padded`)."""
    mask = attention_mask.bool()
    lengths = mask.sum(-1)
    cu_seqlens = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    indices = mask.flatten().nonzero().squeeze(-1)
    return PackedBatch(indices=indices, cu_seqlens=cu_seqlens, lengths=lengths.tolist(), width=mask.shape[1])


def is_right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether every row of a (B, L) mask is real tokens followed by padding only (no left padding, no holes)."""
    mask = attention_mask.bool()
    return bool((mask[:, 1:] <= mask[:, :-1]).all())


def flattened_restarts(position_ids: torch.Tensor | None, input_rows: int) -> bool:
    """Whether the input is a flattened batch: one row whose position_ids restart at 0 after its first token (a 0
    that does not follow -1: positions counting up through 0, as shifted ones may, are one sequence)."""
    return (
        position_ids is not None
        and input_rows == 1
        and position_ids.dim() == 2
        and position_ids.shape[1] > 1
        and bool(((position_ids[0, 1:] == 0) & (position_ids[0, :-1] != -1)).any())
    )


def pack_flattened(position_ids: torch.Tensor, attention_mask=None, cu_seq_lens=None) -> PackedBatch:
    """The packing of a flattened batch from its (1, N) position_ids, which must count 0, 1, 2, ... within every
    sequence. An attention mask, if given, must be all ones, and `cu_seq_lens` (cu_seq_lens_q/k) must agree."""
    positions = position_ids[0]
    if attention_mask is not None and not bool(attention_mask.bool().all()):
        raise ValueError(
            "position_ids restart at 0 (a flattened batch), but attention_mask marks padding: a flattened batch has "
            "no padding; pass either a padded batch with attention_mask or a flattened one with position_ids"
        )
    starts = (positions == 0).nonzero().squeeze(-1)
    if starts.numel() == 0 or int(starts[0]) != 0:
        raise ValueError("position_ids of a flattened batch must start at 0 for its first sequence")
    sequence = torch.cumsum(positions == 0, 0) - 1
    expected = torch.arange(positions.numel(), device=positions.device) - starts[sequence]
    wrong = (positions != expected).nonzero()
    if wrong.numel():
        index = int(wrong[0])
        raise ValueError(
            f"position_ids of a flattened batch must count 0, 1, 2, ... within each sequence and restart at 0; "
            f"got {int(positions[index])} at index {index} where {int(expected[index])} was expected"
        )
    cu_seqlens = F.pad(starts.to(torch.int32), (0, 1), value=positions.numel())
    if cu_seq_lens is not None and not torch.equal(cu_seq_lens.to(cu_seqlens), cu_seqlens):
        raise ValueError(
            f"cu_seq_lens_q/cu_seq_lens_k {cu_seq_lens.tolist()} contradict the sequence starts in position_ids "
            f"{cu_seqlens.tolist()}"
        )
    lengths = cu_seqlens.diff().tolist()
    width = max(lengths)
    indices = sequence * width + positions
    return PackedBatch(indices=indices, cu_seqlens=cu_seqlens, lengths=lengths, width=width, flattened=True)


# A base model's `packing=` when no head planned its pass: it then plans the pass itself. None is a plan (the padded
# path), so it cannot mean "not planned".
UNPLANNED = object()


def pass_inputs(input_ids, inputs_embeds, attention_mask, position_ids, kwargs: dict):
    """What a pass's plan reads: (reference, cu_seq_lens). The reference is the tensor its (batch, seq_len) and device
    come from (input_ids, else inputs_embeds), None where the inputs are malformed (missing, not tensors, under two
    dimensions: no packing is planned, and the base model's input checks say what is wrong); cu_seq_lens is
    `pop_cu_seq_lens(kwargs)`."""
    cu_seq_lens = pop_cu_seq_lens(kwargs)
    reference = input_ids if input_ids is not None else inputs_embeds
    inputs = (reference, attention_mask, position_ids)
    if reference is None or not all(isinstance(t, torch.Tensor | None) for t in inputs) or reference.dim() < 2:
        return None, cu_seq_lens
    return reference, cu_seq_lens


def pop_cu_seq_lens(kwargs: dict) -> torch.Tensor | None:
    """The sequence starts of a flattened batch from the keywords `DataCollatorWithFlattening` emits, popped from a
    forward pass's `kwargs`: cu_seq_lens_q/k (self-attention needs them equal) and max_length_q/k, which the packing
    recomputes. None when neither cu_seq_lens is given."""
    cu_seq_lens, cu_seq_lens_k = kwargs.pop("cu_seq_lens_q", None), kwargs.pop("cu_seq_lens_k", None)
    kwargs.pop("max_length_q", None)
    kwargs.pop("max_length_k", None)
    if cu_seq_lens is None:
        return cu_seq_lens_k
    if cu_seq_lens_k is not None and not torch.equal(cu_seq_lens.to(cu_seq_lens_k), cu_seq_lens_k):
        raise ValueError("cu_seq_lens_q and cu_seq_lens_k differ: self-attention needs the same sequences")
    return cu_seq_lens


def plan_packing(
    config,
    shape: tuple[int, int],
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    cu_seq_lens: torch.Tensor | None = None,
    blocker: str | None = None,
    device: torch.device | None = None,
) -> PackedBatch | None:
    """How this forward pass runs: a PackedBatch for the padding-free path, or None for the padded one.

    A flattened batch (`position_ids` restarting at 0 in a single row, or `cu_seq_lens_q` given) is always packed: no
    other reading of it keeps its sequences apart. A padded batch follows `config.unpad_inputs`: "never" keeps the
    padded path; "auto" packs when the 2D mask holds padding and nothing rules packing out; "always" packs every pass
    and raises when something does. `blocker` names what in this pass rules it out (a KV cache, output_attentions...).
    """
    if cu_seq_lens is not None or flattened_restarts(position_ids, shape[0]):
        if blocker is not None:
            raise ValueError(
                f"position_ids restart at 0 (a flattened batch), which this forward pass cannot take: {blocker}"
            )
        if position_ids is None:
            raise ValueError(
                "cu_seq_lens_q describes a flattened batch; pass its position_ids too (0, 1, 2, ... per sequence)"
            )
        return pack_flattened(position_ids, attention_mask, cu_seq_lens)
    mode = config.unpad_inputs
    if mode == "never":
        return None
    if attention_mask is not None and attention_mask.dim() != 2:
        blocker = blocker or "a 4D attention_mask (pass the 2D padding mask to run padding-free)"
    elif attention_mask is not None and not is_right_padded(attention_mask):
        blocker = blocker or "attention_mask is not right-padded (left padding or holes); pad on the right"
    if mode == "always":
        if blocker is not None:
            raise ValueError(f"config.unpad_inputs='always' but this forward pass cannot run padding-free: {blocker}")
        if attention_mask is None:
            return pack_padded(torch.ones(shape, dtype=torch.bool, device=device))
        return pack_padded(attention_mask)
    if blocker is not None or attention_mask is None or bool(attention_mask.bool().all()):
        return None
    return pack_padded(attention_mask)


def state_shower(restore, packing: PackedBatch | None):
    """How an encoder hands back its per-layer hidden states (`output_hidden_states`): `show(states)` gives the state
    in the input's layout (`restore(states)`: zeros at padding) and the tensor the next layer reads, taken from it.
    The returned states are then the ones the model computed with, so a gradient retained on one (`retain_grad()`,
    as saliency and attribution tools do) arrives; reading zeros at padded positions changes nothing at real tokens,
    where padding is masked out of attention."""

    def show(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shown = restore(states)
        if packing is None or packing.flattened:
            return shown, shown
        return shown, packing.pack(shown)

    return show


def keep_states(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`state_shower` of an encoder called on its own: the states as they are."""
    return states, states


def zero_padding(states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """(B, L, ...) per-token outputs of the padded path with zeros at padded positions (2D mask: 0 = padding), as the
    padding-free path leaves them: a row's outputs do not depend on which path its batch took."""
    if attention_mask is None or attention_mask.dim() != 2:
        return states
    real = attention_mask.to(device=states.device, dtype=torch.bool).view(
        *attention_mask.shape, *[1] * (states.dim() - 2)
    )
    return states.masked_fill(~real, 0.0)
