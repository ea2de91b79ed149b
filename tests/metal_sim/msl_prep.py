"""metal_sim prep step: MSL source -> C++ the shim can compile, line for line.

Rewrites (every one keeps the line count, so clang's errors point at the MSL lines):
1. `threadgroup T name[N]...;` at statement start -> a reference to one object per
   threadgroup: `auto& name = ::metal::msim_tg_ref<T[N]...>(id);` (an empty `threadgroup` macro would
   make the array per-thread).
2. `template [[host_name("x")]] [[kernel]] decltype(f<...>) f<...>;` (MLX's instantiation form,
   a hard error in C++) -> the same explicit instantiation without the attributes, plus a
   registration of `&f<...>` under the host name "x".
3. C-style casts to a vector type, `(float4)v`, are rejected: clang treats them as bit casts
   while Metal converts. Write `float4(v)`.
4. Non-template `[[kernel]]` functions are registered under their own name.
5. Overloads on address spaces collide once address spaces are erased: member functions
   qualified on `this` (`f() device {...}` next to `f() thread {...}`, MLX's complex.h),
   partial specializations on a pointer's address space (`S<device T*>`, MLX's steel
   type_traits.h) and operators returning `device T&`: all but the `thread` one are blanked.
6. `constant T name [[function_constant(n)]];` -> a reference to the runtime's slot n, which
   the host sets per dispatch (Encoder::set_function_constant).
7. Writes a signature table per `[[kernel]]` function: the attribute of each parameter
   (`[[buffer(expr)]]`, `[[threadgroup(expr)]]`, built-ins), which the dispatcher uses to build
   each thread's arguments. The buffer index expressions are copied as C++ expressions. A
   `[[max_total_threads_per_threadgroup(expr)]]` before `[[kernel]]` is registered too: the
   dispatcher rejects larger threadgroups, as pipeline creation on a GPU would.

Usage: msl_prep.py IN.metal OUT.cpp OUT_SIG.hpp
"""

import re
import sys

VECTOR_CAST = re.compile(
    r"\(\s*(?:u?char|u?short|u?int|u?long|half|bfloat|float|bool)[234]\s*\)\s*[\w(]"
)
TG_DECL = re.compile(
    r"^(?P<indent>\s*)threadgroup\s+(?P<type>[A-Za-z_][\w:<>, ]*?)\s+(?P<name>[A-Za-z_]\w*)"
    r"\s*(?P<dims>(?:\[[^\]]+\])*)\s*;\s*(?P<comment>//.*)?$"
)
FUNC_CONST = re.compile(
    r"^(?P<indent>\s*)constant\s+(?P<type>[A-Za-z_]\w*)\s+(?P<name>[A-Za-z_]\w*)\s*"
    r"\[\[\s*function_constant\s*\((?P<index>[^)]*)\)\s*\]\]\s*;\s*(?P<comment>//.*)?$"
)
INST = re.compile(
    r'^\s*template\s+\[\[\s*host_name\s*\(\s*"(?P<host>[^"]+)"\s*\)\s*\]\]\s*'
    r"\[\[\s*kernel\s*\]\]\s*(?P<decl>.*);\s*$"
)
KERNEL = re.compile(
    r"(?:\[\[\s*max_total_threads_per_threadgroup\s*\((?P<maxt>[^)]*)\)\s*\]\]\s*)?"
    r"\[\[\s*kernel\s*\]\]\s*void\s+(?P<name>[A-Za-z_]\w*)\s*\("
)
BUILTINS = {
    "thread_position_in_grid": "kAttrThreadPositionInGrid",
    "thread_position_in_threadgroup": "kAttrThreadPositionInThreadgroup",
    "threadgroup_position_in_grid": "kAttrThreadgroupPositionInGrid",
    "threads_per_threadgroup": "kAttrThreadsPerThreadgroup",
    "threadgroups_per_grid": "kAttrThreadgroupsPerGrid",
    "threads_per_grid": "kAttrThreadsPerGrid",
    "thread_index_in_threadgroup": "kAttrThreadIndexInThreadgroup",
    "thread_index_in_simdgroup": "kAttrThreadIndexInSimdgroup",
    "simdgroup_index_in_threadgroup": "kAttrSimdgroupIndexInThreadgroup",
    "threads_per_simdgroup": "kAttrThreadsPerSimdgroup",
    "simdgroups_per_threadgroup": "kAttrSimdgroupsPerThreadgroup",
    "thread_execution_width": "kAttrThreadExecutionWidth",
    "quadgroup_index_in_threadgroup": "kAttrQuadgroupIndexInThreadgroup",
    "thread_index_in_quadgroup": "kAttrThreadIndexInQuadgroup",
}


class PrepError(Exception):
    pass


def strip_comments(text):
    """Blank out comments and string contents (same length) so that scans see only code."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('"' + " " * (j - i - 1) + '"')
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def split_params(params):
    """Split a parameter list (or an LLVM IR operand list) at top-level commas."""
    parts, depth, cur = [], 0, []
    for ch in params:
        if ch in "([<{":
            depth += 1
        elif ch in ")]>}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return parts


def param_attr(param, kernel, position):
    m = re.search(r"\[\[\s*(\w+)\s*(?:\((.*)\))?\s*\]\]", param)
    if not m:
        # Metal gives a buffer parameter without an attribute the index of its position
        # (MLX's quantized kernels rely on it).
        if "device" not in param and "constant" not in param:
            raise PrepError(f"kernel {kernel}: parameter without attribute: {param.strip()}")
        return f"{{::msim::kAttrBuffer, {position}}}"
    attr, arg = m.group(1), m.group(2)
    if attr == "buffer":
        return f"{{::msim::kAttrBuffer, static_cast<int>({arg})}}"
    if attr == "threadgroup":
        return f"{{::msim::kAttrThreadgroup, static_cast<int>({arg})}}"
    if attr in BUILTINS:
        return f"{{::msim::{BUILTINS[attr]}, 0}}"
    raise PrepError(f"kernel {kernel}: unsupported parameter attribute [[{attr}]]")


TEMPLATE_TAIL = re.compile(r"template\s*<[^;{}]*>\s*$")


def plain_kernels(code):
    """Names of [[kernel]] functions that are not templates (Metal exports them by name)."""
    return [m.group("name") for m in KERNEL.finditer(code)
            if not TEMPLATE_TAIL.search(code[max(0, m.start() - 400) : m.start()])]


def max_threads(code):
    """[[max_total_threads_per_threadgroup(expr)]] of each kernel that declares it."""
    return {m.group("name"): m.group("maxt") for m in KERNEL.finditer(code) if m.group("maxt")}


def kernel_signatures(code):
    sigs = {}
    for m in KERNEL.finditer(code):
        name = m.group("name")
        depth, j = 1, m.end()
        while depth:
            if code[j] == "(":
                depth += 1
            elif code[j] == ")":
                depth -= 1
            j += 1
        params = split_params(code[m.end() : j - 1])
        sigs[name] = [param_attr(p, name, i) for i, p in enumerate(params)]
    return sigs


# An array parameter `constant T a[2]` (MLX's utils.h): clang rejects the address space on
# the parameter itself; it is the pointer it decays to anyway.
ARRAY_PARAM = re.compile(
    r"\b((?:const\s+)?(?:constant|device|threadgroup)\s+(?:const\s+)?[\w:]+)\s+(\w+)\s*"
    r"\[[^\]\[]*\]\s*(?=[,)])"
)
BF16_CAST = re.compile(r"static_cast\s*<\s*(?:bfloat16_t|bfloat)\s*>\s*\(")
ASPACE = r"(?:threadgroup|device|constant)"
ASPACE_OVERLOAD = re.compile(
    # a member function qualified on the address space of `this`
    rf"\)\s*(?:const\s+)?{ASPACE}\s*(?=[:{{])"
    # a partial specialization on a pointer's address space: struct S<device T*>
    rf"|\bstruct\s+\w+\s*<\s*(?:const\s+)?{ASPACE}\s[^<>{{;]*>\s*(?=\{{)"
    # a function returning a reference in a non-thread address space
    rf"|\bconstexpr\s+{ASPACE}\s+[\w:<>]+\s*&\s*operator[^(]*\([^{{;]*\)\s*(?=\{{)"
)


def _match_brace(code, i):
    """Index just past the brace block that starts at code[i] == '{'."""
    depth = 0
    while True:
        if code[i] == "{":
            depth += 1
        elif code[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1


def drop_aspace_overloads(src, code):
    """Blank (keeping newlines) member functions qualified with a non-thread address space."""
    spans = []
    for m in ASPACE_OVERLOAD.finditer(code):
        start = max(code.rfind(c, 0, m.start()) for c in ";{}") + 1
        brace = code.find("{", m.end())
        end = _match_brace(code, brace)
        if code[end : end + 1] == ";":
            end += 1
        spans.append((start, end))
    if not spans:
        return src, code
    out_src, out_code, last = [], [], 0
    for a, b in spans:
        if a < last:
            continue
        blank = "".join(ch if ch == "\n" else " " for ch in src[a:b])
        out_src += [src[last:a], blank]
        out_code += [code[last:a], blank]
        last = b
    out_src.append(src[last:])
    out_code.append(code[last:])
    return "".join(out_src), "".join(out_code)


def prep(src, path):
    code = strip_comments(src)
    src, code = drop_aspace_overloads(src, code)
    src_lines = src.split("\n")
    code_lines = code.split("\n")
    out = []
    reg = 0
    for lineno, (line, cline) in enumerate(zip(src_lines, code_lines), start=1):
        if VECTOR_CAST.search(cline):
            raise PrepError(
                f"{path}:{lineno}: C-style cast to a vector type (clang bit-casts, Metal "
                f"converts); write it as a constructor, e.g. float4(v)"
            )
        m = TG_DECL.match(cline)
        if m:
            out.append(
                f"{m['indent']}auto& {m['name']} = ::metal::msim_tg_ref<{m['type']}{m['dims']}>"
                f"({lineno});"
            )
            continue
        m = FUNC_CONST.match(cline)
        if m:
            out.append(f"{m['indent']}static const {m['type']}& {m['name']} = "
                       f"::msim::function_constant<{m['type']}>({m['index']});")
            continue
        m = INST.match(cline)
        if m:
            host = INST.match(line)["host"]
            decl = m["decl"].strip()
            dm = re.match(r"decltype\((?P<fn>.*)\)\s*(?P<fn2>[\w:]+\s*<.*>)$", decl)
            if dm:
                fn = dm["fn2"].strip()
            else:
                fm = re.match(r".*?\b(?P<fn>[A-Za-z_]\w*\s*<[^()]*>)\s*\(", decl)
                if not fm:
                    raise PrepError(f"{path}:{lineno}: cannot parse the instantiation: {decl}")
                fn = fm["fn"].strip()
            base = re.match(r"\s*([A-Za-z_]\w*)", fn).group(1)
            reg += 1
            out.append(
                f"template {decl}; static const bool msim_reg_{lineno}_{reg} = "
                f'::msim::register_kernel("{host}", "{base}", &{fn});'
            )
            continue
        # `[[threadgroup(n)]]` on a non-kernel function parameter (MLX's steel gemm.h) would
        # lose its keyword to the empty macro; the attribute only matters on kernels.
        line = line.replace("[[threadgroup(", "[[msim_threadgroup(")
        # Metal converts half to bfloat with static_cast; clang rejects that cast.
        line = BF16_CAST.sub("::msim::bf16_cast(", line)
        line = ARRAY_PARAM.sub(r"\1* \2", line)
        out.append(line)
    sigs = kernel_signatures(code)
    # Registrations of non-template kernels go after the last line (line numbers unchanged).
    regs = [f'static const bool msim_reg_plain_{k} = ::msim::register_kernel("{k}", "{k}", &{k});'
            for k in plain_kernels(code)]
    return "\n".join(out + regs), sigs, max_threads(code)


def signature_header(sigs, maxt=None):
    lines = ["// Generated by msl_prep.py: parameter attributes of each [[kernel]].", "#pragma once"]
    for name, expr in (maxt or {}).items():
        lines.append(f'static const bool msim_maxt_{name} = ::msim::register_max_threads('
                     f'"{name}", static_cast<int>({expr}));')
    for name, attrs in sigs.items():
        lines.append(f"static const ::msim::ParamAttr msim_sig_{name}[] = {{")
        lines += [f"    {a}," for a in attrs]
        lines.append("};")
        lines.append(
            f'static const ::msim::SignatureRegistrar msim_sigreg_{name}("{name}", '
            f"msim_sig_{name}, {len(attrs)});"
        )
    return "\n".join(lines) + "\n"


def main(argv):
    src_path, out_path, sig_path = argv[1:4]
    with open(src_path) as f:
        src = f.read()
    try:
        text, sigs, maxt = prep(src, src_path)
    except PrepError as e:
        print(f"msl_prep: {e}", file=sys.stderr)
        return 2
    with open(out_path, "w") as f:
        f.write(f'#line 1 "{src_path}"\n' + text)
    with open(sig_path, "w") as f:
        f.write(signature_header(sigs, maxt))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
