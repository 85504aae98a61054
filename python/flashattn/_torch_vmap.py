"""torch.func.vmap of flashattn's ops: each element of the vmapped dim runs the op once (the
library's batch dim cannot absorb every input's vmapped dim: slopes, broadcast bias), and
with dropout each element draws the batch items one batched call of all of them would
(docs/semantics.md, "Dropout"; as JAX's vmap). _torch_ops.py and _torch_inference.py
register the rule for their ops."""
import torch


def _op_args(op, args, kwargs):
    """An op's arguments as its whole positional list, the schema's defaults filled in (a
    vmap rule gets only those the caller passed)."""
    args = list(args)
    for a in op.default._schema.arguments[len(args):]:
        args.append(kwargs[a.name] if a.name in kwargs else a.default_value)
    return args


def vmap_by_loop(op, batch_of):
    """A vmap rule that runs op once per element of the vmapped dim and stacks the results
    (the library's batch dim cannot absorb every input's vmapped dim: slopes, broadcast bias).
    A dim of size 0 gives results of the shapes one element's would have (the op's fake on
    meta tensors), as torch's own ops do.

    Dropout with one seed for every element (the seed not mapped at this level) draws what
    one batched call of all the elements would (docs/semantics.md, "Dropout"; as JAX's vmap):
    element i passes dropout_batch0 = its caller's + i * stride, stride the batch items one
    element stands for (dropout_batch_stride; 0: batch_of the arguments by name, the items
    of one call: a dense batch, a packed batch's sequences). Nested vmaps reach the innermost
    level's rule first, which passes n * stride as the next level's stride, so an element's
    index is the flattened (row-major) one over the levels that share the seed. A mapped seed
    gives each element its own masks, from its caller's b."""
    names = [a.name for a in op.default._schema.arguments]
    i_p, i_seed, i_b0, i_stride = (names.index(n) for n in ("dropout_p", "seed", "dropout_batch0",
                                                             "dropout_batch_stride"))

    def rule(info, in_dims, *args, **kwargs):
        args = _op_args(op, args, kwargs)
        in_dims = tuple(in_dims) + (None,) * (len(args) - len(in_dims))
        n = info.batch_size
        if n == 0:
            device = next(a.device for a in args if isinstance(a, torch.Tensor))
            one = op(*(torch.empty(a.shape[:d] + a.shape[d + 1:], dtype=a.dtype, device="meta") if d is not None
                       else a.to("meta") if isinstance(a, torch.Tensor) else a for a, d in zip(args, in_dims)))
            result = tuple(torch.empty((0,) + t.shape, dtype=t.dtype, device=device) for t in one)
            return result, (0,) * len(result)

        def element(i):
            return [a.select(d, i) if d is not None else a for a, d in zip(args, in_dims)]
        stride = None  # one seed shared by the elements: the batch items between two of them
        if args[i_p] > 0 and args[i_seed] is not None and in_dims[i_seed] is None:
            stride = args[i_stride] or batch_of(dict(zip(names, element(0))))
        outs = []
        for i in range(n):
            a = element(i)
            if stride is not None:
                a[i_b0], a[i_stride] = args[i_b0] + i * stride, n * stride
            outs.append(op(*a))
        result = tuple(torch.stack(parts) for parts in zip(*outs))
        return result, (0,) * len(result)
    return rule
