#!/usr/bin/env bash
# The bad-input corpus: hostile files and values given to the real ringtrain binary (in CI the sanitized build).
# Every case must end with exit code != 0 and < 128 (no signal; 124 is timeout's), no sanitizer report, and a message matching its
# pattern (the file, line, key or value at fault). The malformed files are generated here.
# Usage: run.sh RINGTRAIN_BINARY
set -uo pipefail
bin=$(realpath "${1:?usage: run.sh RINGTRAIN_BINARY}")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/rt_bad_inputs.XXXXXX")
trap 'umount "$work/small" 2>/dev/null; rm -rf "$work"' EXIT
cd "$work"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
failures=0 cases=0

# expect_error NAME PATTERN COMMAND...: the command fails cleanly with PATTERN (extended regex) in its output.
expect_error() {
  local name=$1 pattern=$2
  shift 2
  cases=$((cases + 1))
  local out rc
  out=$(timeout 120 "$@" 2>&1 </dev/null)
  rc=$?
  local why=""
  if grep -qE "Sanitizer|runtime error:" <<<"$out"; then why="sanitizer report"
  elif [ "$rc" -eq 0 ]; then why="exit code 0"
  elif [ "$rc" -eq 124 ] || [ "$rc" -ge 128 ]; then why="signal or timeout (exit code $rc)"
  elif ! grep -qE -- "$pattern" <<<"$out"; then why="message does not match /$pattern/"
  fi
  if [ -n "$why" ]; then
    failures=$((failures + 1))
    printf 'FAIL %s: %s\n  command: %s\n  output: %s\n' "$name" "$why" "$*" "$(head -c 2000 <<<"$out")"
  else
    printf 'ok   %s (exit %d)\n' "$name" "$rc"
  fi
}

# nested N: a JSON array nested N deep.
nested() { head -c "$1" /dev/zero | tr '\0' '['; head -c "$1" /dev/zero | tr '\0' ']'; }

# le64 N: N as 8 little-endian bytes.
le64() { local n=$1 i; for i in 0 1 2 3 4 5 6 7; do printf "\\x$(printf %02x $(((n >> (8 * i)) & 255)))"; done; }

# safetensors FILE HEADER_JSON DATA_BYTES [HEADER_LENGTH]: a file with that header and DATA_BYTES zero bytes.
safetensors() {
  local len=${4:-${#2}}
  { le64 "$len"; printf '%s' "$2"; head -c "$3" /dev/zero; } >"$1"
}

# A valid tiny checkpoint to derive broken ones from.
"$bin" init-model --out ck --layers 1 --hidden 16 --heads 2 --ffn 32 --vocab 32 >/dev/null || { echo "init-model failed"; exit 1; }
printf '{"input_ids": [1, 2, 3]}\n' >good.jsonl
"$bin" logprobs --model ck --data good.jsonl >/dev/null || { echo "logprobs on a valid checkpoint failed"; exit 1; }
# copy_ck NAME: a copy of the valid checkpoint to break.
copy_ck() { rm -rf "$1"; cp -r ck "$1"; }
# set_key DIR KEY VALUE: replaces one top-level key of DIR/config.json.
set_key() { sed -i -E "s/(\"$2\": )[^,]*/\1$3/" "$1/config.json"; }

# --- data lines (logprobs --data) ---
{ printf '{"input_ids": '; nested 100000; printf '}\n'; } >deep.jsonl
expect_error data-deep-json 'deep.jsonl:1: JSON nested deeper than' "$bin" logprobs --model ck --data deep.jsonl
printf '{"input_ids": [1]}\n\n{"input_ids": [2]}\n' >blank_middle.jsonl
expect_error data-blank-line 'blank_middle.jsonl:2: blank line' "$bin" logprobs --model ck --data blank_middle.jsonl
printf '{"input_ids":[1,2,3],"foo":1}\n' > unknown_field.jsonl
expect_error data-unknown-field-scoring "unknown_field.jsonl:1: unknown field 'foo'" \
  "$bin" logprobs --model ck --data unknown_field.jsonl
: >empty.jsonl
expect_error data-empty-file 'empty.jsonl: no samples' "$bin" logprobs --model ck --data empty.jsonl
printf '\n  \n\n' >blanks.jsonl
expect_error data-only-blank-lines 'blanks.jsonl:1: blank line' "$bin" logprobs --model ck --data blanks.jsonl
mkdir -p data_dir
expect_error data-directory 'data_dir: it is a directory' "$bin" logprobs --model ck --data data_dir
expect_error data-missing 'missing.jsonl: No such file' "$bin" logprobs --model ck --data missing.jsonl
printf '{"input_ids": [1, 2\n' >bad_json.jsonl
expect_error data-invalid-json 'bad_json.jsonl:1: invalid JSON' "$bin" logprobs --model ck --data bad_json.jsonl
printf '{"input_ids": [1, 99]}\n' >oov.jsonl
expect_error data-token-out-of-vocab 'oov.jsonl:1: input_ids\[1\] = 99: not a token id in \[0, 32\)' "$bin" logprobs --model ck --data oov.jsonl
printf '{"input_ids": [1, 1e30]}\n' >float_id.jsonl
expect_error data-float-token 'float_id.jsonl:1: input_ids\[1\] = .*: not a token id' "$bin" logprobs --model ck --data float_id.jsonl
printf '{"input_ids": [%s]}\n' "$(printf '"%0200d",' 0)1" >long_value.jsonl
expect_error data-long-value-truncated 'long_value.jsonl:1: input_ids\[0\] = "0+\.\.\.: not a token id' "$bin" logprobs --model ck --data long_value.jsonl
printf '{"input_ids": [1, 2, 3], "advantages": [0.5, 1]}\n' >short_advantages.jsonl
expect_error data-scoring-checks-training-fields 'short_advantages.jsonl:1: advantages' \
  "$bin" logprobs --model ck --data short_advantages.jsonl
printf '{"ids": [1]}\n' >no_key.jsonl
expect_error data-missing-key "no_key.jsonl:1: unknown field 'ids'" "$bin" logprobs --model ck --data no_key.jsonl
copy_ck short_ck && set_key short_ck max_position_embeddings 4
printf '{"input_ids": [1, 2, 3, 4, 5]}\n' >five.jsonl
expect_error data-beyond-max-positions "five.jsonl:1: input_ids: 5 tokens \\(expected 1 to the model's max_position_embeddings = 4\\)" \
  "$bin" logprobs --model short_ck --data five.jsonl
expect_error data-beyond-max-positions-cp2 "input_ids: 5 tokens \\(expected 1 to the model's max_position_embeddings = 4\\)" \
  "$bin" logprobs --model short_ck --data five.jsonl --cp 2

# --- config.json ---
copy_ck cfg_deep && { printf '{"a": '; nested 100000; printf '}'; } >cfg_deep/config.json
expect_error config-deep-json 'cfg_deep/config.json: JSON nested deeper' "$bin" logprobs --model cfg_deep --data good.jsonl
copy_ck cfg_layers && set_key cfg_layers num_hidden_layers 1099511627776
expect_error config-huge-layers "config.json: key 'num_hidden_layers' = 1099511627776: must be in" \
  "$bin" logprobs --model cfg_layers --data good.jsonl
copy_ck cfg_hidden && set_key cfg_hidden hidden_size 4611686018427387904
expect_error config-huge-hidden "key 'hidden_size' = 4611686018427387904" "$bin" logprobs --model cfg_hidden --data good.jsonl
copy_ck cfg_vocab && set_key cfg_vocab vocab_size -5
expect_error config-negative-vocab "key 'vocab_size' = -5" "$bin" logprobs --model cfg_vocab --data good.jsonl
copy_ck cfg_theta && set_key cfg_theta rope_theta 1e999
expect_error config-infinite-theta 'config.json: invalid JSON|rope_theta' "$bin" logprobs --model cfg_theta --data good.jsonl
copy_ck cfg_theta0 && set_key cfg_theta0 rope_theta -1.0
expect_error config-negative-theta "key 'rope_theta' = -1.0: must be positive" "$bin" logprobs --model cfg_theta0 --data good.jsonl
copy_ck cfg_maxpos && set_key cfg_maxpos max_position_embeddings 0
expect_error config-zero-max-positions "key 'max_position_embeddings' = 0" "$bin" logprobs --model cfg_maxpos --data good.jsonl
copy_ck cfg_array && printf '[1, 2]' >cfg_array/config.json
expect_error config-not-object 'config.json: expected a JSON object' "$bin" logprobs --model cfg_array --data good.jsonl
copy_ck cfg_dir && rm cfg_dir/config.json && mkdir cfg_dir/config.json
expect_error config-is-directory 'cfg_dir/config.json: it is a directory' "$bin" logprobs --model cfg_dir --data good.jsonl
copy_ck cfg_type && set_key cfg_type model_type '"mistral"'
expect_error config-model-type-disagrees "key 'model_type' = \"mistral\": disagrees with 'architectures'" \
  "$bin" logprobs --model cfg_type --data good.jsonl
copy_ck cfg_partial && set_key cfg_partial rope_theta '10000.0, "partial_rotary_factor": 0.5'
expect_error config-partial-rotary "key 'partial_rotary_factor' = 0.5: only 1.0 is supported" \
  "$bin" logprobs --model cfg_partial --data good.jsonl
expect_error export-files-from-a-file 'good.jsonl, where the tokenizer and generation files come from, is not a directory' \
  "$bin" export ck --out export_files --files-from good.jsonl
expect_error export-files-from-nothing 'no_such_dir, where the tokenizer and generation files come from, is not a directory' \
  "$bin" export ck --out export_files --files-from no_such_dir
copy_ck cfg_long && set_key cfg_long hidden_act "\"$(printf '%0500d' 0)\""
expect_error config-long-value-truncated "key 'hidden_act' = \"0+\.\.\.: unsupported" "$bin" logprobs --model cfg_long --data good.jsonl

# --- sliding windows (config.json of Qwen2 / Mistral checkpoints) ---
# add_key DIR JSON: puts one more top-level key first in DIR/config.json.
add_key() { sed -i "s/^{/{$2,/" "$1/config.json"; }
"$bin" init-model --arch qwen2 --out q2 --layers 1 --hidden 16 --heads 2 --ffn 32 --vocab 32 >/dev/null
"$bin" init-model --arch mistral --out mi --layers 1 --hidden 16 --heads 2 --ffn 32 --vocab 32 >/dev/null
rm -rf win_list && cp -r q2 win_list && add_key win_list '"layer_types": 5'
expect_error config-layer-types-not-list "key 'layer_types' = 5: expected a list of num_hidden_layers = 1" \
  "$bin" logprobs --model win_list --data five.jsonl
rm -rf win_type && cp -r q2 win_type && add_key win_type '"layer_types": ["banded"]'
expect_error config-layer-types-unknown 'entry 0 = "banded": expected "sliding_attention" or "full_attention"' \
  "$bin" logprobs --model win_type --data five.jsonl
rm -rf win_max && cp -r q2 win_max && add_key win_max '"max_window_layers": -1'
expect_error config-negative-max-window-layers "key 'max_window_layers' = -1: must not be negative" \
  "$bin" logprobs --model win_max --data five.jsonl
rm -rf win_zero && cp -r mi win_zero && set_key win_zero sliding_window 0
expect_error config-zero-sliding-window "key 'sliding_window' = 0: must be in \\[1, " \
  "$bin" logprobs --model win_zero --data five.jsonl
rm -rf win_cp && cp -r mi win_cp && set_key win_cp sliding_window 2
expect_error window-under-ring-cp "win_cp: config key 'sliding_window' = 2 is shorter than the longest sample of five.jsonl \\(5 tokens\\), and --cp-comm = ring with --cp = 2 takes no sliding window: use --cp-comm = allgather or a2a, or --cp = 1" \
  "$bin" logprobs --model win_cp --data five.jsonl --cp 2
expect_error a2a-heads-not-divisible "win_cp: --cp-comm = a2a with --cp = 4: the model's attention heads \\(2\\) and key/value heads \\(2\\) must both be divisible by cp = 4; use --cp-comm = allgather \\(ring takes no sliding window\\)" \
  "$bin" logprobs --model win_cp --data five.jsonl --cp 4 --cp-comm a2a
expect_error window-without-causal-mask '--window 4 needs a causal mask \(--causal\)' \
  "$bin" attention-check --cp 2 --seq 16 --comm allgather --window 4
expect_error window-negative '--window: Value -3 not in range' \
  "$bin" attention-check --cp 2 --seq 16 --comm allgather --causal --window -3

# --- safetensors ---
st_size=$(stat -c %s ck/model.safetensors)
copy_ck st_trunc && head -c $((st_size - 3)) ck/model.safetensors >st_trunc/model.safetensors
expect_error st-truncated 'st_trunc/model.safetensors: .*(truncated|past the data section)' \
  "$bin" logprobs --model st_trunc --data good.jsonl
copy_ck st_short && head -c 5 ck/model.safetensors >st_short/model.safetensors
expect_error st-too-short 'st_short/model.safetensors: 5 bytes is too short' "$bin" logprobs --model st_short --data good.jsonl
copy_ck st_len && safetensors st_len/model.safetensors '{}' 0 1000
expect_error st-header-beyond-file 'header length 1000 exceeds the file size' "$bin" logprobs --model st_len --data good.jsonl
copy_ck st_huge_len && safetensors st_huge_len/model.safetensors '{}' 0 18446744073709551615
expect_error st-header-length-huge 'header length .* is implausible' "$bin" logprobs --model st_huge_len --data good.jsonl
copy_ck st_deep && safetensors st_deep/model.safetensors "{\"a\": $(nested 100000)}" 0
expect_error st-deep-header 'st_deep/model.safetensors: header: JSON nested deeper' "$bin" logprobs --model st_deep --data good.jsonl
copy_ck st_overlap && safetensors st_overlap/model.safetensors \
  '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}' 12
expect_error st-overlapping 'tensor data overlaps at byte 4' "$bin" logprobs --model st_overlap --data good.jsonl
copy_ck st_mismatch && safetensors st_mismatch/model.safetensors '{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}}' 20
expect_error st-size-mismatch "tensor 'a': 20 bytes for shape \[2, 3\]" "$bin" logprobs --model st_mismatch --data good.jsonl
copy_ck st_overflow && safetensors st_overflow/model.safetensors \
  '{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,16]}}' 16
expect_error st-shape-overflow "tensor 'a'.*overflows" "$bin" logprobs --model st_overflow --data good.jsonl
copy_ck st_dtype && safetensors st_dtype/model.safetensors '{"a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}}' 4
expect_error st-bad-dtype "tensor 'a': unsupported dtype \"F8_E4M3\"" "$bin" logprobs --model st_dtype --data good.jsonl
copy_ck st_entry && safetensors st_entry/model.safetensors "{\"a\":{\"dtype\":\"F32\",\"shape\":[$(printf '1,%.0s' {1..300})1],\"data_offsets\":[0,4]}}" 4
expect_error st-long-shape-truncated "tensor 'a': shape must be a list of at most 8 sizes, got \[1(,1)+\.\.\.$" \
  "$bin" logprobs --model st_entry --data good.jsonl
copy_ck st_shape && safetensors st_shape/model.safetensors '{"model.norm.weight":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}}' 12
expect_error st-missing-tensor "missing tensor 'model.embed_tokens.weight'" "$bin" logprobs --model st_shape --data good.jsonl
copy_ck st_nan
header_len=$(od -An -t u8 -N 8 st_nan/model.safetensors | tr -d ' ')
printf '\x00\x00\xc0\x7f' | dd of=st_nan/model.safetensors bs=1 seek=$((8 + header_len + 4)) conv=notrunc status=none
expect_error st-nan-weight "st_nan/model.safetensors: tensor '.*': element 1 is nan" "$bin" logprobs --model st_nan --data good.jsonl
# An index is read only where no model.safetensors is (transformers' order).
copy_ck st_index && rm st_index/model.safetensors && \
  printf '{"weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}' >st_index/model.safetensors.index.json
expect_error st-index-missing-shard 'model-00001-of-00002.safetensors: No such file' "$bin" logprobs --model st_index --data good.jsonl
copy_ck st_index_deep && rm st_index_deep/model.safetensors && \
  { printf '{"weight_map": '; nested 100000; printf '}'; } >st_index_deep/model.safetensors.index.json
expect_error st-index-deep 'model.safetensors.index.json: JSON nested deeper' "$bin" logprobs --model st_index_deep --data good.jsonl

# --- outputs and CLI values ---
expect_error out-is-input "out ./good.jsonl is the --data file; refusing to overwrite it" "$bin" logprobs --model ck \
  --data good.jsonl --out ./good.jsonl
printf '{"step":1,"loss":1.5}\n' > m.jsonl
expect_error plot-out-is-input "out m.jsonl is the metrics file; refusing to overwrite it" "$bin" plot m.jsonl --out m.jsonl
grep -q '"loss":1.5' m.jsonl || { echo "FAIL plot-out-is-input: the metrics were overwritten"; failures=$((failures + 1)); }
mkdir -p metrics_folder
expect_error plot-metrics-is-a-directory 'cannot read metrics_folder: it is a directory' \
  "$bin" plot metrics_folder --out metrics_folder/curves.svg
expect_error plot-metrics-missing 'cannot open no_metrics.jsonl: No such file' "$bin" plot no_metrics.jsonl --out c.svg
expect_error plot-pattern-matches-nothing "no metric matches 'entropy\*'" "$bin" plot m.jsonl --out c.svg --metrics 'entropy*'
echo '{"input_ids": [1, 2]}' > link_target.jsonl
ln -sf link_target.jsonl out_link
expect_error out-symlink 'refusing to replace out_link: it is a symbolic link' "$bin" logprobs --model ck --data good.jsonl --out out_link
[ -L out_link ] || { echo "FAIL out-symlink: the link was replaced"; failures=$((failures + 1)); }
mkfifo out_fifo
expect_error out-fifo 'refusing to replace out_fifo: it is a FIFO' "$bin" logprobs --model ck --data good.jsonl --out out_fifo
if [ -e /dev/full ]; then
  expect_error stdout-full 'cannot write to standard output: No space left' sh -c "'$bin' logprobs --model ck --data good.jsonl >/dev/full"
  expect_error out-device 'refusing to replace /dev/full: it is a device' "$bin" logprobs --model ck --data good.jsonl --out /dev/full
fi
expect_error init-over-checkpoint 'ck already holds a checkpoint' "$bin" init-model --out ck --layers 1 --hidden 16 --heads 2
expect_error init-nan-theta '--rope-theta: Value nan is not a number' "$bin" init-model --out ck_nan --rope-theta nan
expect_error init-huge-layers '--layers: Value 1000000000 not in range 1 to' "$bin" init-model --out ck_big --layers 1000000000
expect_error init-huge-hidden '--hidden: Value 4611686018427387904 not in range' "$bin" init-model --out ck_big --hidden 4611686018427387904
# An unsigned option read by strtoull would wrap -1 and saturate 2^64.
expect_error init-negative-seed '--seed: Value -1 is not a whole number in \[0, 2\^64\)' "$bin" init-model --out ck_big --seed -1
expect_error generate-seed-2-64 '--seed: Value 18446744073709551616 is not a whole number' "$bin" bench generate \
  --seed 18446744073709551616
[ ! -e ck_nan ] && [ ! -e ck_big ] || { echo "FAIL init-model left a folder behind"; failures=$((failures + 1)); }
expect_error logprobs-cp-zero '--cp: Value 0 not in range 1 to' "$bin" logprobs --model ck --data good.jsonl --cp 0
expect_error backends-negative-seq '--seq: Value -5 not in range 1 to' "$bin" backends --device cpu --dtype fp32 --seq -5
expect_error backends-zero-heads '--heads: Value 0 not in range 1 to' "$bin" backends --device cpu --dtype fp32 --heads 0
expect_error backends-zero-batch '--batch: Value 0 not in range 1 to' "$bin" backends --device cpu --dtype fp32 --batch 0
# A floating option's NaN is refused when parsed (it passes a range check), before the command needs a GPU.
expect_error generate-nan-top-p '--top-p: Value nan is not a number' "$bin" bench generate --top-p nan
expect_error generate-nan-temperature '--temperature: Value NaN is not a number' "$bin" bench generate --temperature NaN
# Sizes the benchmark could never hold, refused before its prompts or model are allocated (and before a GPU is needed).
expect_error generate-decode-only '--backends decode: decode serves only the sampler.s KV-cache calls' \
  "$bin" bench generate --backends decode
expect_error generate-past-positions "--prompt 1048576 \\+ --new-tokens 2 is more than the benchmark model's 1048576 pos" \
  "$bin" bench generate --prompt 1048576 --new-tokens 2
expect_error generate-int32-rows '--batch 65535 x 100511 cache slots .* do not fit int32 row indices' \
  "$bin" bench generate --batch 65535 --prompt 100000
expect_error generate-cache-bytes 'the KV cache of --batch 65535 x 4607 slots .* more than the benchmark.s 68719476736' \
  "$bin" bench generate --batch 65535 --prompt 4096
# --stop-ids: every id a stop token would end each sequence at its first draw; out of range and not a number.
expect_error generate-stop-ids-all '--stop-ids 128256 must leave some of the 128256 token ids running' \
  "$bin" bench generate --stop-ids 128256
expect_error generate-stop-ids-negative '--stop-ids: Value -1 not in range' "$bin" bench generate --stop-ids -1
expect_error generate-stop-ids-text '--stop-ids' "$bin" bench generate --stop-ids x

# --- bench/build_python_module.sh: what it is given is checked before anything is compiled ---
expect_error build-module-usage 'build_python_module.sh BUILD OUT EXT_SUFFIX' bash "$root/bench/build_python_module.sh"
expect_error build-module-no-build 'nowhere/compile_commands.json: no such file' \
  bash "$root/bench/build_python_module.sh" "$work/nowhere" "$work/pkg" .so "$work" "$work"
echo text > not_a_build
expect_error build-module-build-is-a-file 'not_a_build/compile_commands.json: no such file' \
  bash "$root/bench/build_python_module.sh" "$work/not_a_build" "$work/pkg" .so "$work" "$work"
mkdir -p fake_build && touch fake_build/compile_commands.json fake_build/build.ninja
expect_error build-module-no-pybind11 'pybind11/pybind11.h: no such file' \
  bash "$root/bench/build_python_module.sh" "$work/fake_build" "$work/pkg" .so "$work" "$work"
mkdir -p fake_pybind/pybind11 && touch fake_pybind/pybind11/pybind11.h
expect_error build-module-no-include 'missing_include: no such folder' \
  bash "$root/bench/build_python_module.sh" "$work/fake_build" "$work/pkg" .so "$work/fake_pybind" "$work/missing_include"

# --- run configs, overrides and the training run's folders ---
cat > run.yaml <<'YAML'
policy:
  model_name: builtin:tiny
  train_global_batch_size: 1
  train_micro_batch_size: 1
  logprob_batch_size: 1
  max_total_sequence_length: 16
  precision: float32
device: cpu
train:
  steps: 1
  data: good.jsonl
  metrics_dir: ""
YAML
expect_error config-cp-two-overrides 'sets the same setting as the override of parallel.cp; give only one of them' \
  "$bin" config run.yaml parallel.cp=2 policy.dtensor_cfg.context_parallel_size=4
# A group's size: each of dp and cp, and their product, within the ranks one group may have (1024); a value from a
# typo would otherwise start that many CPU ranks (threads) or allocate world x world mailboxes.
expect_error config-cp-too-large 'parallel.cp = 1025: out of range \[1, 1024\]' "$bin" config run.yaml parallel.cp=1025
expect_error config-world-too-large 'parallel.dp \(64\) x parallel.cp \(32\) = 2048 ranks: at most 1024' \
  "$bin" logprobs --config run.yaml --data good.jsonl parallel.dp=64 parallel.cp=32
# yaml-cpp takes a leading FF FE for a UTF-16 byte-order mark and drops the value with it.
expect_error config-override-byte-order-mark 'the value starts with a byte-order mark' \
  "$bin" config run.yaml "$(printf 'train.data=\xff\xfe')"
{ cat run.yaml; printf -- '---\nbogus: 1\n'; } > two_docs.yaml
expect_error config-two-documents 'two_docs.yaml: 2 YAML documents' "$bin" config two_docs.yaml
expect_error config-negative-device "unknown device 'cuda:-1'" "$bin" config run.yaml device=cuda:-1
expect_error config-checkpoint-on-stop-not-bool "train.checkpoint_on_stop = 'maybe': expected true or false" \
  "$bin" config run.yaml train.checkpoint_on_stop=maybe
expect_error train-timeout-zero '--timeout: Value 0 not in range 1 to 604800' "$bin" train --config run.yaml --timeout 0
expect_error grpo-timeout-negative '--timeout: Value -1 not in range 1 to 604800' "$bin" grpo --config run.yaml --timeout -1
expect_error config-backend-twice 'attention.backends\[1\] = math: listed twice' "$bin" config run.yaml \
  'attention.backends=[math, math]'
printf 'policy:\n  model_name: "builtin:tiny\\x00evil"\n' > nul_value.yaml
expect_error config-nul-in-value 'nul_value.yaml:2: policy.model_name: holds a NUL byte' "$bin" config nul_value.yaml
expect_error train-missing-data 'nothere.jsonl: no such file' "$bin" train --config run.yaml train.data=nothere.jsonl
ln -sfn loop_b.jsonl loop_a.jsonl && ln -sfn loop_a.jsonl loop_b.jsonl
expect_error train-data-symlink-loop 'loop_a.jsonl: Too many levels of symbolic links' \
  "$bin" train --config run.yaml train.data=loop_a.jsonl
expect_error train-cpu-under-a-launcher 'ringtrain train on the CPU runs its 1 rank\(s\) .* as threads of one process, but this process is rank 1 of 2 \(torchrun variables\): start it once, without a launcher' \
  env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 "$bin" train --config run.yaml
expect_error grpo-cpu-under-a-launcher 'ringtrain grpo on the CPU runs its 1 rank\(s\) .* this process is rank 0 of 2' \
  env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 "$bin" grpo --config "$root/configs/grpo_tiny.yaml" device=cpu
touch ckpt_file
expect_error train-checkpoint-dir-file 'train.checkpoint_dir = ckpt_file: not a directory' \
  "$bin" train --config run.yaml train.checkpoint_dir=ckpt_file
ln -s no_such_target ckpt_dangling
expect_error train-checkpoint-dir-dangling 'train.checkpoint_dir = ckpt_dangling: a symbolic link to no_such_target, which does not exist' \
  "$bin" train --config run.yaml train.checkpoint_dir=ckpt_dangling
mkdir -p ckpt_partial/step_3
expect_error train-incomplete-step 'ckpt_partial/step_3 is not a complete checkpoint' \
  "$bin" train --config run.yaml train.checkpoint_dir=ckpt_partial --resume
mkdir -p metrics_fifo && mkfifo metrics_fifo/metrics.jsonl
expect_error train-metrics-fifo 'metrics.jsonl: not a regular file' "$bin" train --config run.yaml \
  train.metrics_dir=metrics_fifo
mkdir -p earlier_run && printf '{"step":1,"loss":2.5}\n' > earlier_run/metrics.jsonl
expect_error train-fresh-over-metrics 'earlier_run/metrics.jsonl holds the metrics of an earlier run; pass --resume' \
  "$bin" train --config run.yaml train.metrics_dir=earlier_run
expect_error grpo-fresh-over-metrics 'earlier_run/metrics.jsonl holds the metrics of an earlier run' \
  "$bin" grpo --config run.yaml grpo.prompts=builtin:reverse_digits train.metrics_dir=earlier_run \
  policy.train_global_batch_size=2 grpo.num_prompts_per_step=1 grpo.num_generations_per_prompt=2 loss_fn.type=clipped_pg
expect_error grpo-response-past-length 'grpo.max_new_tokens = 100: prompt .* exceeds policy.max_total_sequence_length = 16' \
  "$bin" grpo --config run.yaml grpo.prompts=builtin:reverse_digits policy.train_global_batch_size=2 \
  grpo.num_prompts_per_step=1 grpo.num_generations_per_prompt=2 loss_fn.type=clipped_pg grpo.max_new_tokens=100 \
  grpo.sft_warmup_steps=5 train.checkpoint_dir=long_ck train.metrics_dir=long_metrics
[ ! -e long_ck ] && [ ! -e long_metrics ] || { echo "FAIL grpo-response-past-length: files made"; failures=$((failures + 1)); }
# `config` makes a GRPO run's own checks too: what `grpo` would refuse, `config` refuses.
grpo_sizes=(policy.train_global_batch_size=2 grpo.num_prompts_per_step=1 grpo.num_generations_per_prompt=2)
expect_error config-grpo-unknown-task 'grpo.prompts = builtin:reverse_words: unknown built-in task' \
  "$bin" config run.yaml grpo.prompts=builtin:reverse_words "${grpo_sizes[@]}" loss_fn.type=clipped_pg
expect_error config-grpo-response-past-length 'grpo.max_new_tokens = 100: prompt .* exceeds policy.max_total_sequence_length = 16' \
  "$bin" config run.yaml grpo.prompts=builtin:reverse_digits "${grpo_sizes[@]}" loss_fn.type=clipped_pg \
  grpo.max_new_tokens=100
# Every record of a prompt file, not only the first step's: a late answer that leaves the warm-up no room.
printf '{"prompt": "12", "answer": "21"}\n{"prompt": "34", "answer": "%s"}\n' "$(printf '4%.0s' $(seq 30))" \
  > long_answer.jsonl
expect_error config-grpo-late-answer-past-length 'long_answer.jsonl:2: SFT warm-up: prompt .34. .* exceeds' \
  "$bin" config run.yaml grpo.prompts=long_answer.jsonl "${grpo_sizes[@]}" loss_fn.type=clipped_pg \
  grpo.max_new_tokens=4 grpo.sft_warmup_steps=1 train.checkpoint_dir=late_ck
# Validation: a prompt file has no held-out part; the held-out file is read and checked whole at the start.
expect_error config-grpo-validation-without-held-out 'grpo.val_prompts is required to validate a run on a prompt file' \
  "$bin" config run.yaml grpo.prompts=long_answer.jsonl "${grpo_sizes[@]}" loss_fn.type=clipped_pg grpo.val_period=1
mkdir -p val_dir
expect_error config-grpo-val-prompts-directory 'val_dir: not a regular file' \
  "$bin" config run.yaml grpo.prompts=builtin:reverse_digits "${grpo_sizes[@]}" loss_fn.type=clipped_pg \
  grpo.val_at_start=true grpo.val_prompts=val_dir
printf '{"prompt": "%s", "answer": "1"}\n' "$(printf '1%.0s' $(seq 30))" > val_long.jsonl
expect_error config-grpo-val-prompt-past-length 'val_long.jsonl:1: validation: grpo.max_new_tokens = 4: prompt' \
  "$bin" config run.yaml grpo.prompts=builtin:reverse_digits "${grpo_sizes[@]}" loss_fn.type=clipped_pg \
  grpo.val_period=2 grpo.val_prompts=val_long.jsonl grpo.max_new_tokens=4
expect_error config-grpo-val-samples-zero 'grpo.max_val_samples = 0: out of range' \
  "$bin" config run.yaml grpo.max_val_samples=0
expect_error logprobs-overrides-without-config 'KEY=VALUE overrides \(parallel.cp=2\) need --config' \
  "$bin" logprobs --model ck --data good.jsonl parallel.cp=2
expect_error config-grpo-not-clipped-pg 'loss_fn.type = nll: a GRPO run trains with clipped_pg' \
  "$bin" config run.yaml grpo.prompts=builtin:reverse_digits "${grpo_sizes[@]}" --no-model
mkdir -p earlier_events && : > earlier_events/events.out.tfevents.1.host
expect_error train-fresh-over-events 'earlier_events/events.out.tfevents.1.host is the TensorBoard event file of an' \
  "$bin" train --config run.yaml train.metrics_dir=earlier_events
grep -q '"loss":2.5' earlier_run/metrics.jsonl || { echo "FAIL train-fresh-over-metrics: the metrics were changed"; failures=$((failures + 1)); }
printf '{"step":1}\nnot a record\n' > earlier_run/metrics.jsonl
expect_error logprobs-data-device '/dev/zero: it is a device, expected a regular file, a pipe or a terminal' \
  "$bin" logprobs --model ck --data /dev/zero
expect_error init-model-empty-out "--out: the checkpoint folder's name is empty" \
  "$bin" init-model --out '' --layers 1 --hidden 16 --heads 2 --ffn 32 --vocab 32
expect_error config-grpo-leave-one-out-not-a-flag "grpo.use_leave_one_out_baseline = 'maybe': expected true or false" \
  "$bin" config run.yaml grpo.use_leave_one_out_baseline=maybe
expect_error config-override-two-documents 'train_micro_batch_size=1.*---.*2.: the value holds 2 YAML documents' \
  "$bin" config run.yaml $'policy.train_micro_batch_size=1\n---\n2'
expect_error train-resume-foreign-metrics 'earlier_run/metrics.jsonl holds the metrics of an earlier run; --resume found no checkpoint in ckpt_new' \
  "$bin" train --config run.yaml train.metrics_dir=earlier_run train.checkpoint_dir=ckpt_new --resume
# logprobs option pairs where one would be ignored
expect_error logprobs-checkpoint-and-reference '--checkpoint and --reference name two different weights' \
  "$bin" logprobs --config run.yaml --data good.jsonl --checkpoint ck --reference
expect_error logprobs-config-and-cp "with --config, --cp is the config's parallel.cp" \
  "$bin" logprobs --config run.yaml --data good.jsonl --cp 2
expect_error logprobs-model-and-reference '--reference needs --config' "$bin" logprobs --model ck --data good.jsonl --reference
mkdir -p ckpt_earlier/step_1 && echo '{}' > ckpt_earlier/step_1/trainer_state.json
expect_error train-fresh-over-checkpoint 'ckpt_earlier/step_1 is a checkpoint of an earlier run: pass --resume' \
  "$bin" train --config run.yaml train.checkpoint_dir=ckpt_earlier
# NUL bytes, which YAML's and JSON's parsers take for the end of the text, and a tag YAML would drop.
sed 's|data: good.jsonl|data: "good.jsonl\\0.extra"|' run.yaml > nul_path.yaml
expect_error config-nul-in-path 'nul_path.yaml:11: train.data: holds a NUL byte' \
  "$bin" train --config nul_path.yaml train.checkpoint_dir=nul_ck
[ ! -e nul_ck ] || { echo "FAIL config-nul-in-path: the checkpoint folder was made"; failures=$((failures + 1)); }
printf '{"input_ids":[1,2,3]}\000garbage {{{\n' > nul_row.jsonl
expect_error data-nul-in-line 'nul_row.jsonl:1: a NUL byte at byte 22' "$bin" train --config run.yaml train.data=nul_row.jsonl
printf '{"prompt":"123","answer":"321"}\000x\n' > nul_prompts.jsonl
expect_error prompts-nul-in-line 'nul_prompts.jsonl:1: a NUL byte at byte 32' "$bin" grpo --config run.yaml \
  policy.model_name=builtin:char-tiny grpo.prompts=nul_prompts.jsonl policy.train_global_batch_size=2 \
  grpo.num_prompts_per_step=1 grpo.num_generations_per_prompt=2 loss_fn.type=clipped_pg grpo.max_new_tokens=4
printf '{"input_ids":[1,2,3],"\\u0000x\\u001b[31m":1}\n' > control_key.jsonl
expect_error data-control-bytes-in-key "unknown field '\\\\x00x\\\\x1b\\[31m' .*expected" \
  "$bin" train --config run.yaml train.data=control_key.jsonl
sed 's|steps: 1|steps: !foo 1|' run.yaml > local_tag.yaml
expect_error config-local-tag "local_tag.yaml:10: train.steps: the tag '!foo' is not one ringtrain reads" \
  "$bin" config local_tag.yaml
printf '{"input_ids":[1,2,3],"token_mask":[1,0,0]}\n{"input_ids":[4,5],"token_mask":[1,1],"sample_mask":0}\n{"input_ids":[6],"token_mask":[1]}\n' \
  > no_target.jsonl
expect_error train-no-loss-target 'no_target.jsonl: no sequence has a loss target' \
  "$bin" train --config run.yaml train.data=no_target.jsonl
{ cat run.yaml; printf '  checkpoint_dir: "ck\n  checkpoint_every: 1\n'; } > open_quote.yaml
expect_error config-open-quote 'open_quote.yaml:13:19: the value "ck .* is not closed on its line' \
  "$bin" train --config open_quote.yaml
{ cat run.yaml; printf '  seed: "2"\n'; } > quoted_number.yaml
expect_error config-quoted-number 'quoted_number.yaml:13: train.seed = "2": a string; expected an integer' \
  "$bin" train --config quoted_number.yaml
printf '{"input_ids":[1,2],"token_mask":[0,1]}\n{"input_ids":[3,4]}\n' > mask_dropped.jsonl
expect_error data-token-mask-dropped 'mask_dropped.jsonl:2: token_mask missing \(mask_dropped.jsonl:1 has it' \
  "$bin" train --config run.yaml train.data=mask_dropped.jsonl
printf '{"input_ids":[1,2],"prev_logprobs":[0,0.5]}\n' > positive_logprob.jsonl
expect_error data-positive-logprob 'positive_logprob.jsonl:1: prev_logprobs\[1\] = 0.5: a log-probability is at most 0' \
  "$bin" train --config run.yaml train.data=positive_logprob.jsonl
mkdir -p stray_ck/step_4.saving && echo mine > stray_ck/step_4.saving/notes
expect_error train-stray-saving-folder 'refusing to remove .*stray_ck/step_4.saving: it is neither an unfinished save' \
  "$bin" train --config run.yaml train.checkpoint_dir=stray_ck
[ -f stray_ck/step_4.saving/notes ] || { echo "FAIL train-stray-saving-folder: the user's file is gone"; failures=$((failures + 1)); }
expect_error cli-mistyped-command "unknown command 'trian' \(did you mean 'train'\?\)" \
  "$bin" trian --config run.yaml
# Resuming from a checkpoint whose folder or data position was tampered with.
for i in 1 2 3 4; do printf '{"input_ids":[%d,2,3,4]}\n' "$i"; done > four.jsonl
"$bin" train --config run.yaml train.data=four.jsonl train.steps=2 train.checkpoint_dir=tampered \
  train.checkpoint_every=1 >/dev/null 2>&1 || { echo "FAIL: the run that makes the tampered checkpoints"; exit 1; }
cp -r tampered/step_1 tampered/step_9
expect_error resume-copied-checkpoint 'tampered/step_9: its trainer_state.json records step 1' \
  "$bin" train --config run.yaml train.data=four.jsonl train.steps=4 train.checkpoint_dir=tampered --resume
rm -rf tampered/step_9
sed -i 's/"epoch": 0,/"epoch": 2305843009213693952,/' tampered/step_2/trainer_state.json
expect_error resume-epoch-too-large 'data.epoch = 2305843009213693952: expected an integer in \[0, 2\^53\]' \
  "$bin" train --config run.yaml train.data=four.jsonl train.steps=4 train.checkpoint_dir=tampered --resume
sed -i 's/"epoch": 2305843009213693952,/"epoch": 0.5,/' tampered/step_2/trainer_state.json
expect_error resume-fractional-epoch 'data.epoch = 0.5: expected an integer in \[0, 2\^53\]' \
  "$bin" train --config run.yaml train.data=four.jsonl train.steps=4 train.checkpoint_dir=tampered --resume
sed -i 's/"epoch": 0.5,/"epoch": 0,/; s/"dp": 1/"dp": 0/' tampered/step_2/trainer_state.json
expect_error resume-mesh-edited 'mesh 0 x 1 does not match its 1 optimizer files' \
  "$bin" train --config run.yaml train.data=four.jsonl train.steps=4 train.checkpoint_dir=tampered --resume
sed -i 's/"dp": 0/"dp": 1/; s/"master_dtype": "[a-z0-9]*"/"master_dtype": "int32"/' tampered/step_2/trainer_state.json
expect_error resume-master-dtype-edited "master_dtype = 'int32': expected fp64, fp32, bf16 or fp16" \
  "$bin" train --config run.yaml train.data=four.jsonl train.steps=4 train.checkpoint_dir=tampered --resume

expect_error rollouts-model-and-shape 'bench rollouts: --model names the model; drop --layers' \
  "$bin" bench rollouts --device cpu --model builtin:tiny --layers 3
expect_error rollouts-model-and-untied 'bench rollouts: --model names the model; drop --untied' \
  "$bin" bench rollouts --device cpu --model builtin:tiny --untied
expect_error rollouts-json-no-folder 'bench rollouts: --json nowhere/r.json: .*nowhere is not a directory' \
  "$bin" bench rollouts --device cpu --model builtin:tiny --json nowhere/r.json

# --- running out of threads: an address-space limit leaves no room for 500 thread stacks (not under ASan, whose
# shadow memory needs the address space; root ignores RLIMIT_NPROC, so `ulimit -u` cannot show it) ---
# grep reads all of ldd's output (no -q): an early exit would end ldd by SIGPIPE, which pipefail reports as a failure.
if ldd "$bin" 2>/dev/null | grep libasan >/dev/null; then
  echo "skip threads-exhausted: a sanitized binary cannot run under ulimit -v"
else
  # Room for the binary and its libraries (their file sizes: a CUDA build maps ~1 GB of them) plus 600 MB: some
  # dozens of 8 MB thread stacks, not 500.
  libs_kb=$(ldd "$bin" | awk '/=> \//{print $3}' | xargs -r stat -L -c %s | awk '{s += $1} END {print int(s / 1024)}')
  limit_kb=$(( ${libs_kb:-0} + $(stat -L -c %s "$bin") / 1024 + 600000 ))
  expect_error threads-exhausted 'cannot start the thread of rank [0-9]+ of 500' \
    sh -c "ulimit -v $limit_kb; exec '$bin' logprobs --model ck --data good.jsonl --cp 500"
  # A config.json that claims a model far larger than its weights (262144 x 4096 tied embeddings, 4 GiB as fp32):
  # named from the headers, within an address-space limit that allocating the claimed weights first would exceed.
  mkdir -p bigcfg && cp ck/model.safetensors bigcfg/
  python3 -c "import json; c = json.load(open('ck/config.json')); c.update(vocab_size=262144, hidden_size=4096, \
num_attention_heads=32, num_key_value_heads=32, head_dim=128, intermediate_size=16, num_hidden_layers=1, \
tie_word_embeddings=True); json.dump(c, open('bigcfg/config.json', 'w'))"
  expect_error logprobs-config-larger-than-weights \
    "tensor 'model.embed_tokens.weight' has shape \[32, 16\], expected \[262144, 4096\]" \
    sh -c "ulimit -v $(( limit_kb + 1000000 )); exec '$bin' logprobs --model bigcfg --data good.jsonl"
fi

# --- a full disk: a 512 KiB tmpfs where mounting one is allowed (root) ---
mkdir -p small
if mount -t tmpfs -o size=512k tmpfs small 2>/dev/null; then
  "$bin" init-model --out small/ck --layers 1 --hidden 16 --heads 2 --ffn 32 --vocab 32 >/dev/null
  old=$(cat small/ck/model.safetensors small/ck/config.json | md5sum)
  expect_error disk-full-new 'No space left on device' "$bin" init-model --out small/big --layers 2 --hidden 128 --vocab 512
  expect_error disk-full-force 'No space left on device' \
    "$bin" init-model --out small/ck --force --layers 2 --hidden 128 --vocab 512
  cases=$((cases + 1))
  if [ -e small/big ] || ls -a small | grep tmp >/dev/null || [ "$(cat small/ck/model.safetensors small/ck/config.json | md5sum)" != "$old" ]; then
    failures=$((failures + 1)); echo "FAIL disk-full-leftovers: $(ls -a small small/ck | tr '\n' ' ')"
  else
    echo "ok   disk-full-leftovers (no partial checkpoint, the old one intact)"
  fi
  umount small
else
  echo "skip disk-full cases: cannot mount a tmpfs here"
fi

# --- launcher ---
expect_error launch-nproc-zero '--nproc: Value 0 not in range 1 to 1024' "$bin" launch --nproc 0 -- true
expect_error launch-nproc-huge '--nproc: Value 100000 not in range 1 to 1024' "$bin" launch --nproc 100000 -- true
expect_error launch-rank-exit-code 'rank 1 failed \(exit code 2\)' \
  sh -c "'$bin' launch --nproc 2 --grace-ms 200 -- sh -c 'if [ \$RANK = 1 ]; then exit 2; fi; sleep 30'; rc=\$?; [ \$rc = 2 ] && exit 3; exit 0"
expect_error launch-missing-command "cannot run 'no-such-command-rt'" "$bin" launch --nproc 2 -- no-such-command-rt
expect_error launch-negative-stop-grace '--stop-grace-ms: Value -5 not in range 0 to 3600000' \
  "$bin" launch --nproc 1 --stop-grace-ms -5 -- true

# A launcher killed with SIGKILL leaves no rank running (each rank's parent-death signal).
cases=$((cases + 1))
"$bin" launch --nproc 2 -- sh -c 'echo $$ > rank$RANK.pid; exec sleep 60' &
launcher=$!
for _ in $(seq 100); do [ -s rank0.pid ] && [ -s rank1.pid ] && break; sleep 0.1; done
kill -9 "$launcher"
wait "$launcher" 2>/dev/null
survivors=""
for f in rank0.pid rank1.pid; do
  [ -s "$f" ] || { survivors="$survivors (no $f)"; continue; }
  pid=$(cat "$f")
  for _ in $(seq 50); do
    state=$(ps -o stat= -p "$pid" 2>/dev/null | tr -d ' ')
    [ -z "$state" ] || [ "${state#Z}" != "$state" ] && break
    sleep 0.1
  done
  [ -z "$state" ] || [ "${state#Z}" != "$state" ] || { survivors="$survivors $pid"; kill -9 "$pid"; }
done
if [ -n "$survivors" ]; then
  failures=$((failures + 1)); echo "FAIL launch-sigkill: ranks survived the launcher:$survivors"
else
  echo "ok   launch-sigkill (no rank survived)"
fi

# Outputs that are the command's own inputs or run files, refused before any work; inputs that are not files.
grpo_args=(grpo.prompts=builtin:reverse_digits policy.train_global_batch_size=2 grpo.num_prompts_per_step=1
  grpo.num_generations_per_prompt=2 loss_fn.type=clipped_pg)
cp run.yaml run_copy.yaml
expect_error grpo-plot-over-config 'run_copy.yaml: the curves go to a file named NAME.svg' \
  "$bin" grpo --config run_copy.yaml "${grpo_args[@]}" train.metrics_dir=plot_metrics --plot run_copy.yaml
cmp -s run.yaml run_copy.yaml || { echo "FAIL grpo-plot-over-config: the config changed"; failures=$((failures + 1)); }
expect_error grpo-plot-over-metrics 'plot_metrics/metrics.jsonl: the curves go to a file named NAME.svg' \
  "$bin" grpo --config run.yaml "${grpo_args[@]}" train.metrics_dir=plot_metrics --plot plot_metrics/metrics.jsonl
ln -sf run_copy.yaml plot_link.svg
expect_error grpo-plot-symlink 'plot_link.svg: exists and is not a regular file' \
  "$bin" grpo --config run.yaml "${grpo_args[@]}" train.metrics_dir=plot_metrics --plot plot_link.svg
expect_error grpo-plot-no-metrics 'train.metrics_dir is empty' "$bin" grpo --config run.yaml "${grpo_args[@]}" \
  --plot curves.svg
expect_error grpo-plot-no-folder 'folder no_folder does not exist' \
  "$bin" grpo --config run.yaml "${grpo_args[@]}" train.metrics_dir=plot_metrics --plot no_folder/curves.svg
[ ! -e plot_metrics ] || { echo "FAIL grpo-plot-*: a run started"; failures=$((failures + 1)); }
copy_ck out_in_model
expect_error out-inside-model 'out out_in_model/model.safetensors lies inside out_in_model \(the --model folder' \
  "$bin" logprobs --model out_in_model --data good.jsonl --out out_in_model/model.safetensors
cmp -s ck/model.safetensors out_in_model/model.safetensors ||
  { echo "FAIL out-inside-model: the weights changed"; failures=$((failures + 1)); }
expect_error out-is-config 'out run_copy.yaml is the --config file' \
  "$bin" logprobs --config run_copy.yaml --data good.jsonl --out run_copy.yaml
mkdir -p fifo_ck && cp ck/model.safetensors fifo_ck/ && mkfifo fifo_ck/config.json
expect_error model-config-fifo 'fifo_ck/config.json: it is a FIFO, expected a regular file' \
  "$bin" logprobs --model fifo_ck --data good.jsonl
mkdir -p decoy && echo keep > decoy/mine.txt && ln -sfn decoy init_link
expect_error init-model-symlink 'init_link: it exists and is not a directory \(a symlink\)' \
  "$bin" init-model --out init_link --layers 1 --hidden 16 --heads 2 --ffn 32 --vocab 32
[ "$(ls decoy)" = mine.txt ] || { echo "FAIL init-model-symlink: wrote into decoy/"; failures=$((failures + 1)); }
expect_error dpo-beta-zero 'loss_fn.reference_policy_kl_penalty = 0: with loss_fn.type = dpo it is DPO.s beta' \
  "$bin" config run.yaml loss_fn.type=dpo
# A resumed run keeps its data order: the seed, the data and the global batch of the run it continues.
"$bin" train --config run.yaml train.data=four.jsonl train.steps=2 train.checkpoint_dir=order_ck >/dev/null 2>&1 ||
  { echo "FAIL resume-order: the first run failed"; failures=$((failures + 1)); }
cp four.jsonl four_edited.jsonl && sed -i '4s/\[4,/[5,/' four_edited.jsonl
for change in policy.train_global_batch_size=2 train.data=four_edited.jsonl train.seed=7; do
  args=(train.data=four.jsonl "$change") && [ "${change%%=*}" = train.data ] && args=("$change")
  expect_error "resume-changed-${change%%=*}" 'a run resumes only with the train.seed, train.data and policy.train_global' \
    "$bin" train --config run.yaml "${args[@]}" train.steps=4 train.checkpoint_dir=order_ck --resume
done
# The same tokens with another mask train on other targets: a changed data file as well.
sed -e 's/}$/, "token_mask": [1, 1, 1, 1]}/' -e '4s/1, 1, 1, 1/1, 1, 0, 1/' four.jsonl > four_masked.jsonl
expect_error resume-changed-token-mask 'a run resumes only with the train.seed, train.data and policy.train_global' \
  "$bin" train --config run.yaml train.data=four_masked.jsonl train.steps=4 train.checkpoint_dir=order_ck --resume

# The training and rollout benchmarks' sizes, named when the command line is parsed.
expect_error bench-train-cp-range '--cp: Value 5000 not in range 1 to 1024' "$bin" bench train --device cpu --cp 5000
expect_error bench-rollouts-sequences-range '--sequences: Value -1 not in range' \
  "$bin" bench rollouts --device cpu --sequences -1

# The rollouts benchmark: --json that is a folder, refused before it runs; its temporary checkpoint removed when a
# Ctrl-C stops it.
expect_error rollouts-json-folder 'bench rollouts: --json .*: exists and is not a regular file' \
  "$bin" bench rollouts --device cpu --json "$work"
cases=$((cases + 1))
mkdir -p "$work/bench_tmp"
TMPDIR="$work/bench_tmp" "$bin" bench rollouts --device cpu --layers 1 --hidden 16 --heads 2 --kv-heads 1 \
  --head-dim 8 --ffn 32 --vocab 64 --sequences 8 --min-len 4 --max-len 65536 --mb-tokens 65536 >/dev/null 2>&1 &
bench_pid=$!
for _ in $(seq 100); do [ -e "$work/bench_tmp/ringtrain-bench-rollouts-$bench_pid" ] && break; sleep 0.05; done
sleep 0.5
kill -INT "$bench_pid"
wait "$bench_pid"
bench_rc=$?
if [ "$bench_rc" -ne 130 ] || [ -n "$(ls -A "$work/bench_tmp")" ]; then
  echo "FAIL rollouts-ctrl-c: exit code $bench_rc (expected 130), left: $(ls -A "$work/bench_tmp")"
  failures=$((failures + 1))
fi

# The device benchmark's power sampling: a negative threshold, and no nvidia-smi to sample with.
py=$(python3 -c "import sys; print(sys.executable)")  # the interpreter itself, not a shim that needs PATH
expect_error bench-power-negative-watts 'active-watts must be >= 0 \(got -1\)' \
  "$py" "$root/bench/compare_hf_logprobs.py" --bin "$bin" --power --active-watts -1
expect_error bench-power-no-nvidia-smi 'power needs nvidia-smi on PATH' \
  env PATH="$work/no_such_dir" "$py" "$root/bench/compare_hf_logprobs.py" --bin "$bin" --power

# The kernel-trace summary: a trace that is missing or a directory, and a gap threshold that is not positive.
expect_error trace-summary-missing 'cannot read the trace' "$py" "$root/bench/kernel_trace_summary.py" "$work/no_trace.csv"
expect_error trace-summary-directory 'cannot read the trace' "$py" "$root/bench/kernel_trace_summary.py" "$work"
expect_error trace-summary-gap-threshold 'max-gap-us must be > 0' \
  "$py" "$root/bench/kernel_trace_summary.py" "$work/no_trace.csv" --gaps 5 --max-gap-us -1

echo "bad inputs: $((cases - failures))/$cases cases passed"
[ "$failures" -eq 0 ]
