#!/usr/bin/env bash
# Build DIR: a git repository of the kind a team that vendors Liger-Kernel has (docs/targets.md, README "Tune your
# own engine"): Liger's Triton ops for a Hugging Face Llama (rms_norm, rope, swiglu), copied byte for byte from the
# installed liger-kernel package, a tiny randomly initialised LlamaForCausalLM that uses them (llama_liger/engine.py),
# the team's torch references (llama_liger/reference.py) and a declaration with just the engine entry.
#
#   examples/liger/make_checkout.sh DIR        # then: autokernel init --repo DIR
#
# Needs liger-kernel and transformers importable by $PYTHON (default: python3), e.g. pip install -e '.[liger]'.
set -euo pipefail

dir=${1:?usage: make_checkout.sh DIR (a new or empty directory)}
python=${PYTHON:-python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
    echo "make_checkout.sh: $dir exists and is not empty; pass a new directory" >&2
    exit 2
fi
src=$("$python" -c 'import liger_kernel, os; print(os.path.dirname(liger_kernel.__file__))' 2>/dev/null) || {
    echo "make_checkout.sh: liger_kernel is not importable by $python; pip install liger-kernel (see README)" >&2
    exit 2
}
versions=$("$python" -c 'import importlib.metadata as m; print(" ".join(f"{p}=={m.version(p)}" for p in ("liger-kernel", "transformers", "torch", "triton")))' 2>/dev/null) || {
    echo "make_checkout.sh: transformers is not importable by $python; pip install transformers (see README)" >&2
    exit 2
}

mkdir -p "$dir/llama_liger/ops"
for op in rms_norm rope swiglu; do
    cp "$src/ops/$op.py" "$dir/llama_liger/ops/$op.py"
done
: > "$dir/llama_liger/__init__.py"
: > "$dir/llama_liger/ops/__init__.py"
cp "$here/engine.py" "$dir/llama_liger/engine.py"
cp "$here/reference.py" "$dir/llama_liger/reference.py"
license=$(ls "$src"/../liger_kernel-*.dist-info/licenses/LICENSE* "$src"/../liger_kernel-*.dist-info/LICENSE* \
          2>/dev/null | head -1 || true)
[ -n "$license" ] && cp "$license" "$dir/llama_liger/ops/LICENSE"

cat > "$dir/autokernel.toml" <<'EOF'
# autokernel target declaration (docs/targets.md): the engine entry; `autokernel init` adds the ops it finds.
[engine]
build = "llama_liger.engine:build"
EOF
cat > "$dir/README.md" <<EOF
# llama_liger: a tiny Hugging Face Llama on Liger-Kernel's Triton ops

llama_liger/ops/{rms_norm,rope,swiglu}.py are copies of liger_kernel/ops/ from $versions
(BSD-2-Clause, llama_liger/ops/LICENSE); their helper imports (liger_kernel.ops.utils) stay on the installed package.
Built by autokernel's examples/liger/make_checkout.sh.
EOF

cd "$dir"
git init -q
git add -A
git -c user.name="autokernel example" -c user.email="example@autokernel.invalid" -c core.hooksPath=/dev/null \
    commit -q -m "llama_liger: a tiny HF Llama on vendored Liger-Kernel ops ($versions)"
echo "built $dir: $(git rev-parse --short HEAD), $versions"
