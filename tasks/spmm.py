"""Dense rows times a sparse projection, ``X @ W`` with W (D, R) at a few non-zeros per column, as a
compiled (numba) kernel that streams X once.

Why a kernel: on row-major features scipy's sparse product runs a scalar loop ~6x slower than the
dense GEMM, and gathering the used input dimensions for BLAS still multiplies every gathered
dimension by every column (benchmarks/README.md, sparse projectors). Every non-zero has to be
applied to every row, so the multiply-adds must run over several rows at once (one vector lane
per row), which needs the rows' values of one input dimension side by side: X transposed.

So the kernel takes ``LANES`` rows at a time and, ``KC`` used input dimensions at a time (64
groups of 16 that some column reads), transposes them into a small dimension-major tile (16 x 16
blocks, each loaded as 16 vectors and transposed in registers by a network of shuffles: scalar code
would pay 1.5-4x a read pass for the transposition alone). Then each output column sums its
non-zeros that fall in the tile: for a column, the ``LANES`` running sums stay in registers while
each non-zero w adds ``w * tile[d, :]``. Both steps are written as LLVM vector operations (numba intrinsics), which
compile to AVX-512 or AVX2 shuffles, multiplies and adds (unfused), or to whatever the CPU has.

Deterministic: code (i, j) is the sum over W's column j in increasing input dimension, each term
``w * x`` rounded then added (a multiply and an add, never fused), whatever the row's position in
its block or the block's in X; so any split of X into row-blocks gives the same bits (the encode
stage and ``metricpipe encode`` slice rows differently).
"""

import numpy as np
import scipy.sparse
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

V = 16  # float32 per vector: one AVX-512 register, two AVX2 ones
NV = 2  # vectors of running sums per column: LANES rows at a time
LANES = V * NV
KC = 1024  # used input dimensions per tile: a 1,024 x 32 float32 tile is 128 KB (in L2)


def _item_pointer(context, builder, aryty, ary, inds):
    a = context.make_array(aryty)(context, builder, ary)
    return cgutils.get_item_pointer2(
        context,
        builder,
        data=a.data,
        shape=cgutils.unpack_tuple(builder, a.shape),
        strides=cgutils.unpack_tuple(builder, a.strides),
        layout=aryty.layout,
        inds=inds,
    )


def _vector_at(context, builder, aryty, ary, i, j):
    """Pointer to the 16 float32 ``ary[i, j:j + 16]`` as an LLVM vector."""
    p = _item_pointer(context, builder, aryty, ary, [i, j])
    return builder.bitcast(p, ir.VectorType(ir.FloatType(), V).as_pointer())


def _int64(context, builder, value, ty):
    return context.cast(builder, value, ty, types.int64)


def _c_float32(*arrays) -> bool:
    """The intrinsics address rows as contiguous float32: anything else does not compile."""
    return all(
        isinstance(a, types.Array) and a.ndim == 2 and a.dtype == types.float32 and a.layout == "C" for a in arrays
    )


@intrinsic
def _transpose16(typingctx, X, r, c, T, k, b):  # pragma: no cover - compiled
    """``T[k + j, b + i] = X[r + i, c + j]`` for i, j < 16 (no bounds checked: the caller's)."""
    if not _c_float32(X, T):
        return None
    sig = types.void(X, r, c, T, k, b)

    def codegen(context, builder, signature, args):
        st = signature.args
        r, c, k, b = (_int64(context, builder, args[i], st[i]) for i in (1, 2, 4, 5))
        rows = [
            builder.load(
                _vector_at(context, builder, st[0], args[0], builder.add(r, ir.Constant(r.type, i)), c), align=4
            )
            for i in range(V)
        ]
        # log2(16) stages; stage h swaps bit h of the row index with bit h of the column index
        h = V // 2
        while h:
            lo = ir.Constant(ir.VectorType(ir.IntType(32), V), [j if not j & h else V + j - h for j in range(V)])
            hi = ir.Constant(ir.VectorType(ir.IntType(32), V), [j + h if not j & h else V + j for j in range(V)])
            new = list(rows)
            for i in range(V):
                if not i & h:
                    new[i] = builder.shuffle_vector(rows[i], rows[i + h], lo)
                    new[i + h] = builder.shuffle_vector(rows[i], rows[i + h], hi)
            rows = new
            h //= 2
        for j in range(V):
            builder.store(
                rows[j],
                _vector_at(context, builder, st[3], args[3], builder.add(k, ir.Constant(k.type, j)), b),
                align=4,
            )
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _column_sum(typingctx, T, dloc, vals, p0, p1, A, j):  # pragma: no cover - compiled
    """``A[j, :LANES] += vals[p] * T[dloc[p], :LANES]`` for p = p0, ..., p1 - 1 in that order, each
    term rounded before it is added; the LANES sums stay in registers over the loop."""
    if not _c_float32(T, A) or vals.dtype != types.float32 or not isinstance(dloc.dtype, types.Integer):
        return None
    sig = types.void(T, dloc, vals, p0, p1, A, j)

    def codegen(context, builder, signature, args):
        st = signature.args
        p0, p1, j = (_int64(context, builder, args[i], st[i]) for i in (3, 4, 6))
        vec = ir.VectorType(ir.FloatType(), V)
        sums = [_vector_at(context, builder, st[5], args[5], j, ir.Constant(j.type, V * q)) for q in range(NV)]
        slots = []
        for q in range(NV):
            slot = cgutils.alloca_once(builder, vec)  # promoted to a register by LLVM
            builder.store(builder.load(sums[q], align=4), slot)
            slots.append(slot)
        with cgutils.for_range_slice(builder, p0, p1, ir.Constant(p0.type, 1), inc=True) as (p, _):
            d = _int64(
                context, builder, builder.load(_item_pointer(context, builder, st[1], args[1], [p])), st[1].dtype
            )
            w = builder.load(_item_pointer(context, builder, st[2], args[2], [p]))
            w = builder.insert_element(ir.Constant(vec, ir.Undefined), w, ir.Constant(ir.IntType(32), 0))
            w = builder.shuffle_vector(
                w, ir.Constant(vec, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), V), [0] * V)
            )
            for q in range(NV):
                x = builder.load(_vector_at(context, builder, st[0], args[0], d, ir.Constant(d.type, V * q)), align=4)
                builder.store(builder.fadd(builder.load(slots[q]), builder.fmul(w, x)), slots[q])
        for q in range(NV):
            builder.store(builder.load(slots[q]), sums[q], align=4)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True, boundscheck=False)
def _codes_of_block(X, r, groups, tptr, dloc, vals, T, A):  # pragma: no cover - compiled
    """A (R, LANES) = the codes of rows r, ..., r + LANES - 1 of X, one lane per row."""
    D = X.shape[1]
    R = A.shape[0]
    ng = groups.shape[0]
    per_tile = KC // V
    A[:] = 0
    for t in range(tptr.shape[0]):
        g0 = t * per_tile
        for q in range(0, LANES, V):
            for g in range(g0, min(g0 + per_tile, ng)):
                c = groups[g]
                k = (g - g0) * V
                if c + V <= D:
                    _transpose16(X, r + q, c, T, k, q)
                else:  # the last dimensions, fewer than 16
                    for i in range(V):
                        for jj in range(V):
                            T[k + jj, q + i] = X[r + q + i, c + jj] if c + jj < D else 0.0
        for j in range(R):
            p0 = tptr[t, j]
            p1 = tptr[t, j + 1]
            if p1 > p0:
                _column_sum(T, dloc, vals, p0, p1, A, j)


@njit(cache=True, nogil=True, boundscheck=False)
def _sparse_rows_matmul(X, groups, tptr, dloc, vals, out):  # pragma: no cover - compiled
    """out (n, R) = X (n, D) @ W, W given tile by tile as `SparseRows` builds it (its arrays are
    trusted: called through `SparseRows.matmul` only)."""
    n, D = X.shape
    R = out.shape[1]
    T = np.zeros((KC, LANES), np.float32)
    A = np.empty((R, LANES), np.float32)
    full = n - n % LANES
    for s in range(0, full, LANES):
        _codes_of_block(X, s, groups, tptr, dloc, vals, T, A)
        for b in range(LANES):
            for j in range(R):
                out[s + b, j] = A[j, b]
    if full < n:  # the last rows, padded with zeros to a whole block
        pad = np.zeros((LANES, D), np.float32)
        for b in range(n - full):
            for d in range(D):
                pad[b, d] = X[full + b, d]
        _codes_of_block(pad, 0, groups, tptr, dloc, vals, T, A)
        for b in range(n - full):
            for j in range(R):
                out[full + b, j] = A[j, b]


class SparseRows:
    """``X @ W`` for a scipy sparse W (D, R), through the compiled kernel (compiled on first use,
    then cached on disk by numba).

    W is kept as the kernel reads it: the input dimensions in groups of 16 (only groups some
    column reads), ``KC`` such dimensions (one tile) at a time; within a tile, each column's non-zeros
    in increasing dimension (``tptr[t, j]:tptr[t, j + 1]`` into ``dloc``, the row in the tile, and
    ``vals``).

    Parameters
    ----------
    W : scipy sparse array of shape (D, R)
    """

    def __init__(self, W):
        # canonical: each (d, j) once; repeated entries are added one by one in CSC order, as
        # toarray() and the stored model's arrays add them (coo's own merge rounds differently)
        W = scipy.sparse.csc_array(W)
        W.sum_duplicates()
        W = W.astype(np.float32).tocoo()
        keep = W.data != 0
        d, j, w = W.coords[0][keep], W.coords[1][keep], W.data[keep]
        R = W.shape[1]
        self.shape = W.shape
        group_ids = np.unique(d // V)  # groups of 16 dimensions that some column reads
        self.groups = (group_ids * V).astype(np.int64)
        per_tile = KC // V
        n_tiles = -(-len(group_ids) // per_tile)
        g = np.searchsorted(group_ids, d // V)
        tile = g // per_tile
        order = np.lexsort((d, j, tile))  # by tile, then column, then dimension
        tile, j, d, g, w = tile[order], j[order], d[order], g[order], w[order]
        self.dloc = ((g - tile * per_tile) * V + d % V).astype(np.int32)
        self.vals = np.ascontiguousarray(w, np.float32)
        counts = np.zeros(n_tiles * R, np.int64)
        np.add.at(counts, tile * R + j, 1)
        starts = np.concatenate([[0], np.cumsum(counts)])
        self.tptr = (
            np.stack([starts[t * R : (t + 1) * R + 1] for t in range(n_tiles)])
            if n_tiles
            else np.zeros((0, R + 1), np.int64)
        )

    def matmul(self, X: np.ndarray) -> np.ndarray:
        """Codes (n, R) float32 of the rows X (n, D) (cast to C-ordered float32)."""
        X = np.ascontiguousarray(X, np.float32)
        if X.ndim != 2 or X.shape[1] != self.shape[0]:
            raise ValueError(f"X has shape {X.shape}; expected (n, {self.shape[0]}).")
        out = np.empty((X.shape[0], self.shape[1]), np.float32)
        _sparse_rows_matmul(X, self.groups, self.tptr, self.dloc, self.vals, out)
        return out
