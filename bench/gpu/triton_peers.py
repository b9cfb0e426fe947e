"""The plain Triton peers of the memory-bound benchmark: GeLU, softmax (one-row program up to 16384
columns, online two-pass beyond), row sum. No torch import, so bench/gpu/triton_softmax_cubin.py
can compile the same softmax program where torch is not installed; memory_bound_peers.py times
them (it passes torch tensors to the launchers)."""
import triton
import triton.language as tl

SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)


@triton.jit
def gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    u = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
    # 0.5 x (1 + tanh(u)) == x * sigmoid(2u)
    y = x / (1.0 + tl.exp(-2.0 * u))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def triton_gelu(x, out):
    n = x.numel()
    BLOCK = 1024
    gelu_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)
    return out


@triton.jit
def softmax_row_kernel(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * cols + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_looped_kernel(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    # Long rows: online max / sum over blocks, then a second read that writes.
    row = tl.program_id(0).to(tl.int64)
    base = row * cols
    m = tl.full([BLOCK], -float("inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + base + offs, mask=offs < cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
        s = tl.where(m_new == -float("inf"), 0.0, s)
        m = m_new
    mx = tl.max(m, axis=0)
    total = tl.sum(s * tl.exp(m - mx), axis=0)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + base + offs, mask=offs < cols, other=-float("inf")).to(tl.float32)
        y = tl.exp(x - mx) / total
        tl.store(y_ptr + base + offs, y.to(y_ptr.dtype.element_ty), mask=offs < cols)


def triton_softmax(x, out):
    rows, cols = x.shape
    if cols <= 16384:
        BLOCK = triton.next_power_of_2(cols)
        warps = 4 if BLOCK <= 1024 else 8 if BLOCK <= 4096 else 16
        softmax_row_kernel[(rows,)](x, out, cols, BLOCK=BLOCK, num_warps=warps)
    else:
        softmax_looped_kernel[(rows,)](x, out, cols, BLOCK=4096, num_warps=8)
    return out


@triton.jit
def rowsum_kernel(x_ptr, y_ptr, rows, cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    acc = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    for start in range(0, cols, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        mask = (r[:, None] < rows) & (c[None, :] < cols)
        acc += tl.load(x_ptr + r[:, None] * cols + c[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + r, tl.sum(acc, axis=1), mask=r < rows)


def triton_rowsum(x, out):
    rows, cols = x.shape
    BLOCK_C = min(triton.next_power_of_2(cols), 4096)
    BLOCK_R = max(1, 4096 // BLOCK_C)
    rowsum_kernel[(triton.cdiv(rows, BLOCK_R),)](x, out, rows, cols, BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C,
                                                 num_warps=8)
    return out
