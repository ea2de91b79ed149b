"""Instruments the LLVM IR of a metal_sim kernel translation unit for the cost model.

Every basic block of a kernel-code function (anything not in the shim's msim:: / metal::detail
namespaces) gets a call `msim_count_block(ID)` after its phis, and every load and store a call
`msim_count_mem(ptr, bytes, is_store)` (src/counters.cpp classifies the address at run time:
device, constant, threadgroup, private). The static content of each block is classified here,
once: integer ALU, float ALU, conversions, conditional branches, simd collectives, simdgroup
matrix ops, barriers, in-simdgroup barriers. `llvm.memcpy`/`memmove`/`memset` get a call
`msim_count_copy(dst, src, bytes)` (a load of src and a store to dst, classified like any access:
clang lowers 16-byte struct and array copies, such as MLX's x loads, to memcpy). Vector
instructions count once per lane (Apple GPUs execute them lane by
lane); bit casts, swizzles (extract/insert/shufflevector), integer width changes, taking the high
16 bits of a 32-bit value for a 16-bit use, and unconditional branches count zero.

Usage: instrument(ir_text) -> (instrumented IR text, [per-block class counts]).
"""

import re
from collections import Counter

from msl_prep import split_params as split_top

INT_OPS = {"add", "sub", "mul", "udiv", "sdiv", "urem", "srem", "shl", "lshr", "ashr", "and",
           "or", "xor", "icmp"}
FLOAT_OPS = {"fadd", "fsub", "fmul", "fdiv", "frem", "fneg", "fcmp"}
CONV_OPS = {"sitofp", "uitofp", "fptosi", "fptoui", "fpext", "fptrunc"}
# Integer width changes (trunc/zext/sext) are free too: Apple GPUs address the 16-bit halves of
# their 32-bit registers directly, and clang spells a half2 bit cast on x86 as shifts + truncs
# (see HIGH_HALF).
FREE_OPS = {"bitcast", "inttoptr", "ptrtoint", "addrspacecast", "freeze", "extractelement",
            "trunc", "zext", "sext",
            "insertelement", "shufflevector", "extractvalue", "insertvalue", "phi", "alloca",
            "ret", "unreachable"}
INT_INTRINSICS = ("llvm.umin", "llvm.umax", "llvm.smin", "llvm.smax", "llvm.abs", "llvm.fshl",
                  "llvm.fshr", "llvm.ctpop", "llvm.ctlz", "llvm.cttz", "llvm.bswap",
                  "llvm.bitreverse")
FLOAT_INTRINSICS = ("llvm.fma", "llvm.fmuladd", "llvm.fabs", "llvm.minnum", "llvm.maxnum",
                    "llvm.minimum", "llvm.maximum", "llvm.copysign", "llvm.floor", "llvm.ceil",
                    "llvm.trunc", "llvm.rint", "llvm.round", "llvm.nearbyint", "llvm.sqrt",
                    "llvm.exp", "llvm.log", "llvm.sin", "llvm.cos", "llvm.pow")
CONV_INTRINSICS = ("llvm.fptosi.sat", "llvm.fptoui.sat", "llvm.lrint", "llvm.lround")
FREE_INTRINSICS = ("llvm.lifetime", "llvm.assume", "llvm.dbg", "llvm.experimental.noalias",
                   "llvm.prefetch")
# Block copies: no ALU work, their memory traffic is counted at run time (copy_call).
COPY_INTRINSICS = ("llvm.memcpy", "llvm.memmove", "llvm.memset")
# Shim functions: their code models the hardware (or the simulator) and is not counted.
SHIM = re.compile(r"^_ZN(?:4msim|5metal6detail)|^_ZZN5metal|^_GLOBAL__|^__cxx_global|^msim_")
CLASSES = ["int_alu", "float_alu", "conversion", "branch", "simd", "simdgroup_matrix", "barrier",
           "simd_barrier", "call"]

SCALAR_BYTES = {"i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "half": 2, "bfloat": 2,
                "float": 4, "double": 8, "ptr": 8}


def type_bytes(t):
    t = t.strip()
    m = re.match(r"^<(\d+) x (.+)>$", t) or re.match(r"^\[(\d+) x (.+)\]$", t)
    if m:
        return int(m.group(1)) * type_bytes(m.group(2))
    if t.startswith("{") or t.startswith("<{"):
        inner = t.strip("<>{} ")
        return sum(type_bytes(x) for x in split_top(inner))
    if t.startswith("ptr"):
        return 8
    if t in SCALAR_BYTES:
        return SCALAR_BYTES[t]
    raise ValueError(f"type size of {t!r}")


def first_type(s):
    """The leading type of an operand list: `<4 x float> %a, ...` -> `<4 x float>`."""
    s = s.strip()
    if s[0] in "<{[":
        close = {"<": ">", "{": "}", "[": "]"}[s[0]]
        depth = 0
        for i, ch in enumerate(s):
            if ch == s[0]:
                depth += 1
            elif ch == close:
                depth -= 1
                if depth == 0:
                    return s[: i + 1]
    return s.split()[0].rstrip(",")


def lanes(t):
    m = re.match(r"^<(\d+) x ", t)
    return int(m.group(1)) if m else 1


FLAGS = {"nsw", "nuw", "exact", "disjoint", "nnan", "ninf", "nsz", "arcp", "contract", "afn",
         "reassoc", "fast", "nneg", "samesign", "inbounds", "tail", "musttail", "notail"}


def strip_flags(s):
    words = s.split(" ")
    while words and words[0] in FLAGS:
        words.pop(0)
    return " ".join(words)


def string_constants(ir):
    out = {}
    for m in re.finditer(r'^(@[\w.]+) = .*?c"((?:[^"\\]|\\.)*)"', ir, re.M):
        out[m.group(1)] = m.group(2)
    return out


HIGH_HALF = re.compile(r"^\s+(%[\w.]+) = lshr i32 %[\w.]+, 16$")


def high_half_names(lines):
    """Values `lshr i32 v, 16` used only by truncs to i16: the high half of a register."""
    cands = {m.group(1) for ln in lines if (m := HIGH_HALF.match(ln))}
    ok = set(cands)
    for ln in lines:
        for name in cands & set(re.findall(r"%[\w.]+", ln.split("=", 1)[-1])):
            if not re.search(rf"trunc (?:nuw |nsw )*i32 {re.escape(name)} to i16", ln):
                ok.discard(name)
    return ok


def classify(line, strings):
    """(class, count) of one instruction line, or None when it costs nothing here."""
    body = line.strip()
    if re.match(r"^(?:i\d+ -?\d+, label %|\])", body):
        return None  # the case list of a multi-line switch
    m = re.match(r"^%[\w.]+ = (.*)$", body)
    rhs = strip_flags(m.group(1) if m else body)
    op, _, rest = rhs.partition(" ")
    rest = strip_flags(rest)
    if op in ("load", "store"):
        return None  # counted at run time by address space
    if op in FREE_OPS:
        return None
    if op == "br":
        return ("branch", 1) if rest.startswith("i1 ") else None
    if op == "switch":
        return ("branch", 1)
    if op == "getelementptr":
        # address arithmetic: one integer op unless every index is a constant zero
        idx = split_top(rest)[2:]
        return ("int_alu", 1) if any(not re.search(r"\b0$", x.strip()) for x in idx) else None
    if op in INT_OPS:
        return ("int_alu", lanes(first_type(rest)))
    if op in FLOAT_OPS:
        t = rest.split(" ", 1)[1] if op == "fcmp" else rest
        return ("float_alu", lanes(first_type(strip_flags(t))))
    if op in CONV_OPS:
        return ("conversion", lanes(first_type(rest)))
    if op == "icmp":
        return ("int_alu", lanes(first_type(rest.split(" ", 1)[1])))
    if op == "select":
        vt = first_type(split_top(rest)[1])
        elem = re.sub(r"^<\d+ x (.+)>$", r"\1", vt)
        cls = "float_alu" if elem in ("half", "bfloat", "float", "double") else "int_alu"
        return (cls, lanes(vt))
    if op == "call" or op.startswith("call"):
        callee = re.search(r"@([\w.$]+)\(", rest)
        name = callee.group(1) if callee else ""
        if name.startswith(FREE_INTRINSICS) or name.startswith(COPY_INTRINSICS):
            return None
        ret = first_type(rest)
        if name.startswith(INT_INTRINSICS):
            return ("int_alu", lanes(ret))
        if name.startswith(CONV_INTRINSICS):
            return ("conversion", lanes(ret))
        if name.startswith(FLOAT_INTRINSICS):
            return ("float_alu", lanes(ret))
        if "msim10collective" in name:
            what = re.search(r"\(ptr (?:noundef )?(?:nonnull )?(@[\w.]+)", rest)
            text = strings.get(what.group(1), "") if what else ""
            if "simdgroup_multiply" in text:
                return ("simdgroup_matrix", 1)
            return ("simd_barrier", 1) if text.startswith("simdgroup_barrier\\") else ("simd", 1)
        if "msim7barrier" in name:
            return ("barrier", 1)
        if re.search(r"msim(3ctx|8tg_alloc|4fail|10buffer_arg|8tg_param|"
                     r"21function_constant_slot)", name):
            return None
        if SHIM.search(name):
            return ("call", 1)
        return None  # a kernel-code helper: its own blocks are counted
    raise ValueError(f"unclassified instruction: {body}")


MEM = re.compile(r"^(?P<ind>\s+)(?:%[\w.]+ = )?(?P<op>load|store)\b(?P<rest>.*)$")


def mem_call(line):
    m = MEM.match(line)
    if not m:
        return None
    rest = m.group("rest").strip()
    rest = re.sub(r"^(volatile|atomic)\s+", "", rest)
    if m.group("op") == "load":
        t = first_type(rest)
        ptr = re.search(r", ptr (%[\w.]+)", rest[len(t):])
        store = 0
    else:
        t = first_type(rest)
        ptr = re.search(r", ptr (%[\w.]+)(?:, align \d+)?(?:, !.*)?$", rest)
        store = 1
    if ptr is None:
        return None  # a global (shim state): not a kernel memory access
    return (f"{m.group('ind')}call void @msim_count_mem(ptr {ptr.group(1)}, i32 "
            f"{type_bytes(t)}, i32 {store})")


COPY = re.compile(r"^(?P<ind>\s+)(?:tail )?call void @llvm\.(?P<op>memcpy|memmove|memset)[\w.]*\((?P<args>.*)\)"
                  r"(?: #\d+)?(?:, !.*)?$")


def copy_call(line):
    """The counting call for a memcpy/memmove/memset line (None for any other line)."""
    m = COPY.match(line)
    if not m:
        return None
    args = [a.strip() for a in split_top(m.group("args"))]
    operand = lambda a: a.split()[-1]  # noqa: E731  (attributes come before the value)
    dst = operand(args[0])
    src = "null" if m.group("op") == "memset" else operand(args[1])
    length = args[2]
    ty, val = length.split()[0], operand(length)
    return (f"{m.group('ind')}call void @msim_count_copy(ptr {dst}, ptr {src}, {ty} {val})",
            ty)


LABEL = re.compile(r"^([\w.$-]+):")


def instrument(ir):
    strings = string_constants(ir)
    out, blocks = [], []
    copy_types = set()
    lines = ir.split("\n")
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        fm = re.match(r"^define .*?@([\w.$]+)\(", line)
        if not fm or SHIM.search(fm.group(1)) or not line.rstrip().endswith("{"):
            out.append(line)
            i += 1
            continue
        out.append(line)
        i += 1
        pending = True  # the entry block starts here
        counts = Counter()
        block_lines = []
        end = lines.index("}", i)
        free_shifts = high_half_names(lines[i:end])

        def flush():
            nonlocal counts, block_lines
            if block_lines is None:
                return
            bid = len(blocks)
            blocks.append(dict(counts))
            # insert the block counter after the phis (and the label)
            j = 0
            while j < len(block_lines) and (LABEL.match(block_lines[j]) or
                                            re.match(r"^\s+%[\w.]+ = phi ", block_lines[j])):
                j += 1
            block_lines.insert(j, f"  call void @msim_count_block(i32 {bid})")
            out.extend(block_lines)
            counts, block_lines = Counter(), []

        while i < n and lines[i] != "}":
            line = lines[i]
            if LABEL.match(line):
                if not pending:
                    flush()
                pending = False
                block_lines.append(line)
            elif line.startswith("  ") and not line.strip().startswith(";"):
                pending = False
                mc = mem_call(line)
                if mc:
                    block_lines.append(mc)
                cc = copy_call(line)
                if cc:
                    block_lines.append(cc[0])
                    copy_types.add(cc[1])
                hh = HIGH_HALF.match(line)
                c = None if hh and hh.group(1) in free_shifts else classify(line, strings)
                if c:
                    counts[c[0]] += c[1]
                block_lines.append(line)
            else:
                block_lines.append(line)
            i += 1
        flush()
        out.append(lines[i])
        i += 1
    out.append("declare void @msim_count_block(i32)")
    out.append("declare void @msim_count_mem(ptr, i32, i32)")
    if copy_types - {"i64"}:
        raise ValueError(f"block copy lengths of type {copy_types}: msim_count_copy takes i64")
    out.append("declare void @msim_count_copy(ptr, ptr, i64)")
    return "\n".join(out), blocks
