# Sourced by lab/offline/flashinfer_carry.sh, lab/offline/sglang_carry.sh and lab/offline/vllm_carry.sh (from the repo root).
#
# swap_in_carry DIR STAGED MAX_MB: replace the carry DIR (.fi, .sgl, .vllm) with the tree built in
# STAGED, warn when git would not ignore it, print its size and fail above MAX_MB MiB: a carry
# travels with the working tree to the GPU box, 64 MiB a call in all.
swap_in_carry() {
    local dir=$1 staged=$2 max_mb=$3 bytes
    rm -rf "$dir" && mv "$staged" "$dir"
    grep -qxF "$dir/" .gitignore || echo "warning: $dir/ is not in .gitignore" >&2
    bytes=$(du -sb "$dir" | cut -f1)
    echo "$dir: $(du -sh "$dir" | cut -f1) ($bytes bytes)"
    if [ "$bytes" -gt $((max_mb * 1024 * 1024)) ]; then
        echo "error: $dir is over $max_mb MiB" >&2
        return 1
    fi
}
