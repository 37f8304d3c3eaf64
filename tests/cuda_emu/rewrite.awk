# CUDA emulation: rewrites a .cu file (or .cuh) so that the host C++ compiler
# builds it against tests/cuda_emu/include. Run as
#   awk -v src=kernels/cuda/ops.cu -f tests/cuda_emu/rewrite.awk kernels/cuda/ops.cu > out.cpp
# A mechanical rewrite rather than macros in the sources, so the .cu files
# stay plain CUDA. Three forms change, nothing else:
#   kernel<<<grid, block, smem, stream>>>(args)
#     -> emu::launcher(kernel, "kernel", emu::launch_config(grid, block, smem, stream))(args)
#   cudaLaunchCooperativeKernel((void *)kernel, ...)   (kernel may be a template's kernel<32>)
#     -> emu::launch_cooperative(kernel, "kernel", ...)   (the kernel's type unpacks the argument array)
#   __shared__ [__align__(N)] T a[N], b;   (one or more lines)
#     -> references to the block's own copies: T (&a)[N] = *static_cast<T (*)[N]>(emu::shared_var(...));
#   extern __shared__ T s[];
#     -> T *const s = static_cast<T *>(emu::dynamic_shared(alignment));
# A `static` __shared__ would be one copy for every block, wrong as soon as
# two blocks are resident (a cooperative grid); shared_var gives each block
# its own, between redzones. Lines stay one for one (a declaration over
# several lines is emitted on its first and leaves blank ones) and a #line
# directive names the original file, so errors point at the .cu source.
# Limits (the build stops with a message): <<<...>>>( on one line; no
# top-level commas inside a __shared__ type (templates).

function fail(msg) {
    printf "%s:%d: rewrite.awk: %s\n", src, NR, msg > "/dev/stderr"
    failed = 1
    exit 1
}

function trim(s) {
    gsub(/^[ \t]+|[ \t]+$/, "", s)
    return s
}

# Splits s at commas outside parentheses and brackets into parts[1..n].
function split_top(s, parts,    n, depth, i, c, start) {
    n = 0
    depth = 0
    start = 1
    for (i = 1; i <= length(s); i++) {
        c = substr(s, i, 1)
        if (c == "(" || c == "[") depth++
        else if (c == ")" || c == "]") depth--
        else if (c == "," && depth == 0) {
            parts[++n] = substr(s, start, i - start)
            start = i + 1
        }
    }
    parts[++n] = substr(s, start)
    return n
}

# A variable's alignment: its type's, or a larger __align__(N) (a smaller one
# does not lower it, in nvcc as in C++).
function alignment(align, type) {
    if (align == "") return "alignof(" type ")"
    return "((size_t)(" align ") > alignof(" type ") ? (size_t)(" align ") : alignof(" type "))"
}

function emit_shared(text,    pos, pre, rest, semi, decl, post, align, n, parts, i, p, b, head, dims, name, type, a, out) {
    pos = index(text, "__shared__")
    pre = substr(text, 1, pos - 1)
    rest = substr(text, pos + length("__shared__"))
    semi = index(rest, ";")
    decl = substr(rest, 1, semi - 1)
    post = substr(rest, semi + 1)
    align = ""
    if (match(decl, /__align__\([^)]*\)/)) {
        align = substr(decl, RSTART + 10, RLENGTH - 11)
        decl = substr(decl, 1, RSTART - 1) substr(decl, RSTART + RLENGTH)
    }
    if (pre ~ /extern[ \t]*$/) {
        sub(/extern[ \t]*$/, "", pre)
        if (!match(decl, /[A-Za-z_][A-Za-z0-9_]*[ \t]*\[[ \t]*\][ \t]*$/)) fail("cannot read the extern __shared__ declaration")
        name = substr(decl, RSTART, RLENGTH)
        sub(/[ \t]*\[.*/, "", name)
        type = trim(substr(decl, 1, RSTART - 1))
        print pre type " *const " name " = static_cast<" type " *>(emu::dynamic_shared(" alignment(align, type) "));" post
        return
    }
    n = split_top(decl, parts)
    out = pre
    type = ""
    for (i = 1; i <= n; i++) {
        p = parts[i]
        b = index(p, "[")
        head = trim(b ? substr(p, 1, b - 1) : p)
        dims = b ? trim(substr(p, b)) : ""
        if (i == 1) {
            if (!match(head, /[A-Za-z_][A-Za-z0-9_]*$/)) fail("cannot read the __shared__ declaration")
            name = substr(head, RSTART, RLENGTH)
            type = trim(substr(head, 1, RSTART - 1))
        } else {
            name = head
        }
        if (type == "" || name !~ /^[A-Za-z_][A-Za-z0-9_]*$/) fail("cannot read the __shared__ declaration")
        a = alignment(align, type)
        out = out "static const emu::shared_site emu_site_" name " = {\"" name "\", __FILE__, __LINE__}; " \
              type (dims == "" ? " &" name : " (&" name ")" dims) " = *static_cast<" type \
              (dims == "" ? " *" : " (*)" dims) ">(emu::shared_var(&emu_site_" name ", sizeof(" type dims "), " a \
              "));" (i < n ? " " : "")
    }
    print out post
}

function rewrite_launches(s,    name, rest, end_cfg, cfg) {
    while (match(s, /[A-Za-z_][A-Za-z0-9_:]*(<[^<>]*>)?<<</)) {
        name = substr(s, RSTART, RLENGTH - 3)
        rest = substr(s, RSTART + RLENGTH)
        end_cfg = index(rest, ">>>(")
        if (!end_cfg) fail("a <<<...>>>( launch must sit on one line")
        cfg = substr(rest, 1, end_cfg - 1)
        s = substr(s, 1, RSTART - 1) "emu::launcher(" name ", \"" name "\", emu::launch_config(" cfg "))(" \
            substr(rest, end_cfg + 4)
    }
    if (index(s, "<<<")) fail("a launch this rewrite cannot read")
    while (match(s, /cudaLaunchCooperativeKernel\(\(void \*\)[A-Za-z_][A-Za-z0-9_]*(<[0-9, ]*>)?,/)) {
        name = substr(s, RSTART + 36, RLENGTH - 37)
        s = substr(s, 1, RSTART - 1) "emu::launch_cooperative(" name ", \"" name "\"," substr(s, RSTART + RLENGTH)
    }
    if (index(s, "cudaLaunchCooperativeKernel(")) fail("write cudaLaunchCooperativeKernel((void *)kernel, ...)")
    return s
}

NR == 1 { print "#line 1 \"" src "\"" }

pending != "" {
    pending = pending " " $0
    extra++
    if (index($0, ";")) {
        emit_shared(pending)
        for (i = 0; i < extra; i++) print ""
        pending = ""
    }
    next
}

{
    code = $0
    sub(/\/\/.*/, "", code)
    if (code ~ /__shared__/) {
        if (index(code, ";")) emit_shared($0)
        else {
            pending = $0
            extra = 0
        }
        next
    }
    print rewrite_launches($0)
}

END {
    if (!failed && pending != "") fail("a __shared__ declaration without its ;")
}
